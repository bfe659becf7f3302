"""hongbao: a red-packet (红包) service.

Grabs run as atomic Lua scripts on Redis; money lives in an SQL ledger that a
persister keeps in step with the Redis event streams.
"""

from hongbao.errors import HongbaoError

__all__ = ["HongbaoError"]
__version__ = "0.1.0"
