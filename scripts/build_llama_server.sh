#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (that target only) from the llama.cpp tree that the installed
# llama-cpp-python vendors, and cache it under ~/.cache/inferlab/llama-server-<commit>/.
# Prints the binary's path on its last line. The conformance tests (tests/conformance/) run it.
#
# Source: the sdist of llama-cpp-python on PyPI (`pip download --no-binary :all:`) ships
# vendor/llama.cpp and the submodule's HEAD (.git/modules/vendor/llama.cpp/HEAD), whose commit
# names the cache folder. A cached binary is reused: no download, no build.
# Build: CPU only, static, no HTTPS, no web UI download; about 4 minutes on 2 cores. Runs under
# `flock /tmp/inferlab-heavy.lock` so that it does not overlap timing measurements.
# Needs cmake and a C++ compiler; when missing and running as root (CI), installs them with apt.
set -euo pipefail

CACHE_ROOT="${INFERLAB_CACHE:-$HOME/.cache/inferlab}"
JOBS="${INFERLAB_BUILD_JOBS:-2}"
PY="${PYTHON:-python}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')}"

marker="$CACHE_ROOT/llama-server-for-llama-cpp-python-$VERSION"
if [[ -f "$marker" ]]; then
    bin="$(cat "$marker")"
    if [[ -x "$bin" ]]; then
        echo "$bin"
        exit 0
    fi
fi

need_pkgs=()
command -v cmake >/dev/null 2>&1 || need_pkgs+=(cmake)
command -v c++ >/dev/null 2>&1 || need_pkgs+=(g++)
command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || need_pkgs+=(make)
if ((${#need_pkgs[@]})); then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "build_llama_server: installing ${need_pkgs[*]}" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >&2
    else
        echo "build_llama_server: needs ${need_pkgs[*]} (apt-get install -y ${need_pkgs[*]})" >&2
        exit 1
    fi
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/inferlab-llama-server.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "build_llama_server: downloading the llama-cpp-python $VERSION sdist" >&2
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
top="$work/llama_cpp_python-$VERSION"
src="$top/vendor/llama.cpp"
commit="unknown"
if [[ -f "$top/.git/modules/vendor/llama.cpp/HEAD" ]]; then
    commit="$(head -c 40 "$top/.git/modules/vendor/llama.cpp/HEAD")"
fi
short="${commit:0:7}"
dest="$CACHE_ROOT/llama-server-$short"
if [[ ! -x "$dest/llama-server" ]]; then
    gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    # AMX code generation off: on some Xeons the native build crashes in AMX kernels (scripts/test).
    flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    echo "build_llama_server: building llama-server at llama.cpp $short (jobs=$JOBS)" >&2
    flock /tmp/inferlab-heavy.lock bash -c '
        set -euo pipefail
        [[ -x "$7/llama-server" ]] && exit 0  # built by another run while this one waited
        cmake -S "$1" -B "$2" "${@:8}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_COMMIT="$4" -DLLAMA_BUILD_NUMBER=0 \
            -DCMAKE_C_FLAGS="$3" -DCMAKE_CXX_FLAGS="$3" >&2
        cmake --build "$2" --target llama-server -j "$5" >&2
        mkdir -p "$7"
        cp "$2/bin/llama-server" "$7/llama-server.tmp"
        mv "$7/llama-server.tmp" "$7/llama-server"
        printf "{\"llama_cpp_python\": \"%s\", \"llama_cpp_commit\": \"%s\"}\n" "$6" "$4" > "$7/build.json"
    ' _ "$src" "$work/build" "$flags" "$commit" "$JOBS" "$VERSION" "$dest" "${gen[@]}"
fi
mkdir -p "$CACHE_ROOT"
echo "$dest/llama-server" > "$marker"
echo "$dest/llama-server"
