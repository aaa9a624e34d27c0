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
# Java for the Spark tests (pyspark, in the test venv below, starts its JVMs with it);
# Chromium for the test that renders the HTML report headless.
TEST_PACKAGES=(openjdk-17-jre-headless chromium)

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
# DuckDB with its delta extension and the deltalake package: the readers of the Delta tables
# sluice writes (sluice-testkit/src/lake.rs), implementations other than the one it commits with;
# PyIceberg (with its SQL catalog's SQLite and PostgreSQL drivers) and DuckDB's iceberg extension
# (which needs its avro one) the same for the Iceberg tables.
# pyspark: the Spark data source's tests (python/tests/test_spark*.py: local[2] and a standalone
# cluster started from this installation, on loopback).
PYTHON_TEST_PKGS=("pyarrow==26.0.1" "pandas==3.1.1" "pytest==9.2.0" "psycopg[binary]==3.3.9"
    "pymysql==1.2.4" "firebird-driver==2.1.0" "duckdb==1.4.4" "duckdb-ext-delta==1.4.4.20260205"
    "deltalake==1.6.6" "pyspark==4.1.4" "pyiceberg[sql-sqlite,sql-postgres]==0.12.0"
    "duckdb-ext-iceberg==1.4.4.20260205" "duckdb-ext-avro==1.4.4.20260205")
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

# MySQL 9 (Oracle's server; BASE_PACKAGES' mariadb-server is MariaDB) for the tests of that
# flavour, under ~/.cache/sluice/mysql9 (SLUICE_MYSQL9_HOME overrides; sluice-testkit looks
# there). Debian's stable releases carry no MySQL, so it comes from Debian unstable (sid):
# mysql-server-core and mysql-client-core with every library they load, sid's C library and
# loader included, fetched by apt with a private configuration and lists, unpacked with
# dpkg-deb -x. The system's apt sources and dpkg state are not touched. Its programs run
# through sid's own loader and libraries (bin/ holds a wrapper per program), so a newer glibc
# than the system's is no obstacle. sid drops old versions, so nothing is pinned: the stamp
# holds the version installed, re-runs are a no-op without the network, and deleting the
# directory takes sid's current version. Debian (or a derivative with apt, dpkg-deb and the
# Debian archive keyring) only.
MYSQL9_PACKAGES=(mysql-server-core mysql-client-core)
ensure_mysql9() {
    local dir="${SLUICE_MYSQL9_HOME:-$HOME/.cache/sluice/mysql9}"
    if [ -f "$dir/stamp" ] && [ -x "$dir/bin/mysqld" ]; then return 0; fi
    ensure_debian_packages debian-archive-keyring
    say "installing MySQL from Debian sid into $dir"
    local work="$dir.part.$$"
    rm -rf "$work"
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/debs" "$work/root"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main\n' \
        > "$work/apt/sources.list"
    # Everything apt writes goes under $work; the system's dpkg status is only read (apt-cache
    # needs one). The sandbox user is this one: apt's own _apt user could not write here.
    local apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
        -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache"
        -o Dir::State::status=/var/lib/dpkg/status -o "APT::Sandbox::User=$(id -un)")
    apt-get "${apt_opts[@]}" update -qq || die "apt-get update of Debian sid failed (see above)"
    # Every package in the dependency closure, whether or not the system has it: the system's
    # copies are older than what sid's binaries were built against. Perl is left out: only
    # helper scripts use it, never mysqld or the client programs.
    local pkgs
    pkgs=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
            --no-conflicts --no-breaks --no-replaces --no-enhances "${MYSQL9_PACKAGES[@]}" \
        | grep -E '^[a-z]' | grep -vE '^(perl|libperl)' | sort -u)
    [ -n "$pkgs" ] || die "Debian sid lists no ${MYSQL9_PACKAGES[*]}"
    # shellcheck disable=SC2046 # one word per package
    (cd "$work/debs" && apt-get "${apt_opts[@]}" download -qq $(printf '%s/sid\n' $pkgs)) \
        || die "downloading MySQL's packages from Debian sid failed (see above)"
    for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$work/root"; done
    local ld
    ld=$(cd "$work/root" && ls usr/lib/*-linux-gnu/ld-linux*.so.* 2>/dev/null | head -n 1)
    [ -n "$ld" ] || die "no dynamic loader in sid's libc6 under $work/root"
    # A wrapper for each program (ELF files only; the Perl and shell helpers are left out),
    # finding the tree from its own location so that the directory can be renamed.
    mkdir -p "$work/bin"
    local p
    for p in "$work"/root/usr/sbin/* "$work"/root/usr/bin/*; do
        [ "$(head -c 4 "$p" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
        local name
        name=$(basename "$p")
        cat > "$work/bin/$name" <<WRAPPER
#!/bin/sh
# $name from Debian sid, run through sid's loader and libraries.
r=\$(dirname "\$(readlink -f "\$0")")/../root
exec "\$r/$ld" --library-path "\$r/$(dirname "$ld")" "\$r/${p#"$work/root/"}" "\$@"
WRAPPER
        chmod +x "$work/bin/$name"
    done
    # Only the programs and libraries are needed.
    rm -rf "$work/apt" "$work/debs" "$work"/root/usr/share/{doc,man,locale,lintian}
    local version
    version=$("$work/bin/mysqld" --version) || die "the unpacked mysqld does not run"
    version="MySQL ${version#* Ver }"
    case "$version" in
        "MySQL 9."*) ;;
        *) die "Debian sid's MySQL is not 9.x ($version): sluice-testkit's MySQL 9 server expects it" ;;
    esac
    printf '%s\n' "$version" > "$work/stamp"
    rm -rf "$dir"
    mv "$work" "$dir"
    say "installed $version"
}
