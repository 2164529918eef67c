#!/usr/bin/env bash
# Installs libstrap into a fresh prefix and builds a tiny consumer against it twice: with CMake
# (find_package(strap), targets strap::strap and strap::strap_static) and with pkg-config
# (`pkg-config --cflags --libs strap`, and --static), and once as C++; each consumer runs and
# checks the library it linked answers.
# Usage: test_install.sh SOURCE_DIR WORK_DIR C_COMPILER
set -euo pipefail
src=$1 work=$2 cc=$3
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake -S "$src" -B "$work/build" -DSTRAP_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_INSTALL_PREFIX="$prefix" >"$work/configure.log"
cmake --build "$work/build" -j2 >"$work/build.log"
cmake --install "$work/build" >"$work/install.log"

mkdir -p "$work/consumer"
cat >"$work/consumer/main.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <strap.h>
int main(void)
{
	strap_session_params p = strap_default_session_params();
	char sock[512];
	if (p.ring_size != 0 || strap_resolve_socket_path("/x.sock", sock, sizeof sock) != STRAP_OK ||
	    strcmp(sock, "/x.sock") != 0 || strcmp(strap_errstr(STRAP_E_CLOSED), "connection closed by strapd") != 0 ||
	    strap_dtype_size(STRAP_DTYPE_BF16) != 2 || strap_ggml_row_size(STRAP_GGML_Q4_0, 64) != 36)
		return 1;
	puts("consumer ok " STRAP_VERSION_STRING);
	return 0;
}
C
cat >"$work/consumer/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(strap 0.1 REQUIRED)
add_executable(consumer_shared main.c)
target_link_libraries(consumer_shared PRIVATE strap::strap)
add_executable(consumer_static main.c)
target_link_libraries(consumer_static PRIVATE strap::strap_static)
C
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  >"$work/consumer.log"
cmake --build "$work/consumer/build" >>"$work/consumer.log"
"$work/consumer/build/consumer_shared"
"$work/consumer/build/consumer_static"
# the shared consumer really uses the installed libstrap.so (ldd's output read whole first:
# `ldd | grep -q` under pipefail fails whenever grep exits before ldd has written its last line)
deps=$(ldd "$work/consumer/build/consumer_shared")
grep -q "$prefix/lib.*/libstrap.so" <<<"$deps" || {
  echo "consumer_shared does not load $prefix's libstrap.so:"; echo "$deps"; exit 1; }
# the shared library exports the API (strap_*, and seed 003's llama_resource_* names,
# llama-resource-instrumentation.h) and nothing internal
if nm -D --defined-only "$prefix"/lib*/libstrap.so | awk 'NF == 3 && $2 ~ /[TDBR]/ {print $3}' |
   grep -Ev '^(strap_[a-z]|llama_resource_[a-z])'; then
  echo "libstrap.so exports symbols that are not the API"; exit 1
fi
# every global symbol of the static library carries the prefix (it shares its host's namespace)
if nm -g --defined-only "$prefix"/lib*/libstrap.a | awk 'NF == 3 {print $3}' | grep -Ev '^(strap_|llama_resource_[a-z])'; then
  echo "libstrap.a defines global symbols without the strap_ prefix"; exit 1
fi

export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name strap.pc)")
pkg-config --exists strap
[ "$(pkg-config --modversion strap)" = 0.1.0 ]
# shellcheck disable=SC2046
"$cc" -o "$work/pc_shared" "$work/consumer/main.c" $(pkg-config --cflags --libs strap) \
  -Wl,-rpath,"$(pkg-config --variable=libdir strap)"
"$work/pc_shared"
# shellcheck disable=SC2046
"$cc" -static -o "$work/pc_static" "$work/consumer/main.c" $(pkg-config --cflags --libs --static strap)
"$work/pc_static"
# C++ (llama.cpp and most engines): the header compiles as C++ and links (extern "C")
if command -v c++ >/dev/null; then
  cp "$work/consumer/main.c" "$work/consumer/main.cpp"
  # shellcheck disable=SC2046
  c++ -std=c++17 -Wall -Wextra -Werror -o "$work/pc_cxx" "$work/consumer/main.cpp" $(pkg-config --cflags --libs strap) \
    -Wl,-rpath,"$(pkg-config --variable=libdir strap)"
  "$work/pc_cxx"
fi
echo "install_consumers: ok"
