"""Free text a sender writes (the greeting): what it may hold."""

from __future__ import annotations

import re

from hongbao.errors import InvalidRequest

MAX_GREETING = 200

#: refused in a greeting: C0 controls but tab, newline and carriage return; DEL and the
#: C1 controls; and the bidirectional overrides and isolates (U+202A-202E, U+2066-2069),
#: which make text display in another order than it is stored ("Trojan Source")
GREETING_FORBIDDEN = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
#: the same rule as a JSON Schema pattern (the OpenAPI document shows it)
GREETING_PATTERN = f"^[^{GREETING_FORBIDDEN}]*$"
_FORBIDDEN = re.compile(f"[{GREETING_FORBIDDEN}]")


def require_greeting(greeting: object, field: str = "greeting") -> str:
    """`greeting` if it is acceptable text, else InvalidRequest naming the field."""
    if not isinstance(greeting, str) or len(greeting) > MAX_GREETING:
        raise InvalidRequest(f"{field} must be text of at most {MAX_GREETING} characters", field)
    bad = _FORBIDDEN.search(greeting)
    if bad is not None:
        raise InvalidRequest(
            f"{field} may not contain the control or text-direction character "
            f"U+{ord(bad.group()):04X}",
            field,
        )
    return greeting
