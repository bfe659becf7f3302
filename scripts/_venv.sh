# Shared by scripts/setup and scripts/test (sourced, not run): the checkout's .venv, and
# Debian packages installed only when missing.

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"

# venv_install ARGS...: create .venv if needed, then `pip install --quiet ARGS` into it
venv_install() {
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  # pip >= 25.1 reads [dependency-groups] (--group); an up-to-date pip is left alone
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "pip>=25.1"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"
}

# has_extra NAME: true when pyproject.toml declares the optional-dependencies extra NAME
has_extra() {
  "$PYTHON" -c 'import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"].get("optional-dependencies", {})
sys.exit(sys.argv[1] not in extras)' "$1"
}

# apt_ensure WHY PACKAGE...: install the Debian packages that are not installed yet, as
# root; otherwise print a note saying WHY they are wanted. Nothing happens when all are
# there, so a second run costs no apt call.
apt_ensure() {
  local why=$1 missing=() p
  shift
  if ! command -v dpkg-query >/dev/null; then
    echo "note: not a Debian system; $why needs: $*" >&2
    return 0
  fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    if [ -z "${_APT_UPDATED:-}" ]; then
      apt-get update -qq
      _APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "note: ${missing[*]} missing; $why (as root: apt-get install ${missing[*]})" >&2
  fi
}
