# Shared by scripts/test, scripts/demo and bench/run. Source it; do not run it.
# Everything a newcomer needs is installed here, so nothing depends on a hand-installed tool.

# Build artefacts live outside the clone so repeated runs (and CI's fresh clones) reuse them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "installing packages needs root: run as root or install sudo"; fi
}

# ensure_debian_packages PKG… — install the Debian packages that are missing.
ensure_debian_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing Debian packages: ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# ensure_rust — cargo with rustfmt and clippy.
ensure_rust() {
    command -v cargo >/dev/null || die "cargo not found: install Rust with https://rustup.rs (stable toolchain), then re-run"
    if command -v rustup >/dev/null; then
        rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
        rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
    fi
}

# The packages every command needs: a C toolchain for zstd, PostgreSQL (server + psql), MariaDB
# (server + client), and the libraries the embedded Firebird engine (PyPI wheel
# firebird-embedded) links against.
BASE_PACKAGES=(build-essential pkg-config ca-certificates postgresql postgresql-client
    mariadb-server mariadb-client libtommath1 libtomcrypt1 redis-server)

testkit() { "$CARGO_TARGET_DIR/$1/sluice-testkit" "${@:2}"; }

# Object-storage emulators for the tests, under ~/.cache/sluice/objstore (where sluice-testkit
# looks for them; SLUICE_OBJSTORE_TOOLS overrides): moto's S3 server and gcp-storage-emulator
# in a Python venv, Azurite (Azure Blob) from npm. A stamp holding the pinned versions makes
# re-runs a no-op.
OBJSTORE_PY=("moto[server]==5.2.5" "gcp-storage-emulator==2026.7.19")
OBJSTORE_NPM=("azurite@3.35.0")
ensure_objstore_emulators() {
    local dir="${SLUICE_OBJSTORE_TOOLS:-$HOME/.cache/sluice/objstore}"
    local want="${OBJSTORE_PY[*]} ${OBJSTORE_NPM[*]}"
    if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$want" ]; then return 0; fi
    ensure_debian_packages python3 python3-venv
    command -v npm >/dev/null || ensure_debian_packages nodejs npm
    say "installing object-storage emulators into $dir"
    mkdir -p "$dir"
    [ -x "$dir/venv/bin/python" ] || /usr/bin/python3 -m venv "$dir/venv"
    "$dir/venv/bin/python" -m pip install -q "${OBJSTORE_PY[@]}"
    npm install --silent --no-save --prefix "$dir/npm" "${OBJSTORE_NPM[@]}" >/dev/null
    printf '%s' "$want" > "$dir/stamp"
}

# The Python package's test environment, a venv under ~/.cache/sluice/python-venv with the
# pinned packages the tests use (pyarrow and pandas as users have them; psycopg, PyMySQL and
# firebird-driver to set up test data). A stamp holding the pins makes re-runs a no-op.
PYTHON_TEST_PKGS=("pyarrow==26.0.1" "pandas==3.1.1" "pytest==9.2.0" "psycopg[binary]==3.3.9"
    "pymysql==1.2.4" "firebird-driver==2.1.0")
ensure_python_test_venv() {
    local dir="$HOME/.cache/sluice/python-venv"
    local want="${PYTHON_TEST_PKGS[*]}"
    if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$want" ]; then return 0; fi
    ensure_debian_packages python3 python3-venv
    say "installing the Python test packages into $dir"
    [ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv "$dir"
    "$dir/bin/python" -m pip install -q "${PYTHON_TEST_PKGS[@]}"
    printf '%s' "$want" > "$dir/stamp"
}
