# Installers for bench/run. Source after scripts/lib/common.sh. Every function is idempotent:
# it checks what is there and installs only what is missing, so a second run starts at once.

BENCH_VENV="${SLUICE_BENCH_VENV:-$HOME/.cache/sluice/bench-venv}"
BENCH_PY="$BENCH_VENV/bin/python"
PEERS_ROOT="${SLUICE_BENCH_PEERS:-$HOME/.cache/sluice/peers}"
# The peer's version is pinned so two machines compare against the same thing; bump on purpose.
RIVET_VERSION="0.32.2"
# python3-venv for the venv, time for `/usr/bin/time -v`, psql for the floor and loading.
BENCH_PACKAGES=(python3 python3-venv time postgresql-client)

# ensure_bench_python — a venv with bench/requirements.txt, reinstalled when that file changes.
ensure_bench_python() {
    ensure_debian_packages python3 python3-venv
    local req="$BENCH_DIR/requirements.txt" stamp="$BENCH_VENV/.requirements.sha256"
    local want; want="$(sha256sum "$req" | cut -d' ' -f1)"
    if [ ! -x "$BENCH_PY" ]; then
        say "creating the benchmark venv in $BENCH_VENV"
        /usr/bin/python3 -m venv "$BENCH_VENV"
    fi
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        say "installing the benchmark's Python packages"
        "$BENCH_PY" -m pip install -q --upgrade pip >/dev/null
        "$BENCH_PY" -m pip install -q -r "$req"
        echo "$want" >"$stamp"
    fi
    export PYTHONPATH="$BENCH_DIR${PYTHONPATH:+:$PYTHONPATH}"
}

# ensure_sluice_build — the release binaries the lab measures (cargo does nothing if current).
ensure_sluice_build() {
    say "building sluice (release)"
    (cd "$BENCH_DIR/.." && cargo build --release --locked -q -p sluice-cli -p sluice-testkit -p sluice-python)
}

# assemble_python_pkg BIN_DIR — the sluice Python package from the release build's native
# module (the sluice-py-* rows import it); exports SLUICE_BENCH_PYTHON_PKG.
assemble_python_pkg() {
    local lib="$1/lib_sluice.so" dir="$1/python-pkg"
    [ -f "$lib" ] || return 0
    rm -rf "$dir" && mkdir -p "$dir"
    cp -r "$BENCH_DIR/../python/sluice" "$dir/sluice"
    cp "$lib" "$dir/sluice/_sluice.abi3.so"
    export SLUICE_BENCH_PYTHON_PKG="$dir"
}

# ensure_rivet — the rivet peer from crates.io, built once into $PEERS_ROOT.
ensure_rivet() {
    if [ -x "$PEERS_ROOT/bin/rivet" ] && "$PEERS_ROOT/bin/rivet" --version 2>/dev/null | grep -qF "$RIVET_VERSION"; then
        return
    fi
    mkdir -p "$PEERS_ROOT"
    say "installing rivet-cli $RIVET_VERSION from crates.io into $PEERS_ROOT (a long build, once)"
    # Its own lock file and its default features (jemalloc is part of how it is shipped and
    # tuned). Its own target directory: the shared one is locked while cargo builds in it, and
    # this build is long enough to stall everyone else's. A failure is not fatal: the report
    # then says rivet could not be installed, and why.
    if ! CARGO_TARGET_DIR="$PEERS_ROOT/target" cargo install rivet-cli --version "$RIVET_VERSION" \
            --locked --root "$PEERS_ROOT" >"$PEERS_ROOT/install.log" 2>&1; then
        say "rivet-cli did not install (see $PEERS_ROOT/install.log); its rows are reported as not available"
        export SLUICE_BENCH_RIVET_UNAVAILABLE="cargo install rivet-cli $RIVET_VERSION failed: $(grep -m1 -E '^error' "$PEERS_ROOT/install.log" || tail -n 1 "$PEERS_ROOT/install.log")"
        return
    fi
    rm -rf "$PEERS_ROOT/target"  # gigabytes of intermediate files, not needed once installed
}

# testkit_supports_mariadb — true when the test kit ($TESTKIT) can start MariaDB (`run --mariadb`).
# An unknown option is refused before any server starts, so the probe is instant when the
# option is missing; when it exists the probe starts and stops one MariaDB.
testkit_supports_mariadb() {
    local out
    out="$("$TESTKIT" run --mariadb -- true 2>&1)" && return 0
    [[ "$out" != *"unknown option"* ]]
}
