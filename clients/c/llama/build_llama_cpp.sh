#!/usr/bin/env bash
# Fetches llama.cpp as vendored by the llama-cpp-python sdist on PyPI (there is no other source
# reachable here) and builds only its `llama` shared library (CPU, no `common`, no tools), into a
# cache outside the checkout keyed by the sdist's version:
#   $STRAP_LLAMA_CACHE (default ~/.cache/strap-llm/llama.cpp-<ver>)/
#     src/        the vendored llama.cpp tree (include/llama.h, ggml/include, models/, gguf-py/,
#                 convert_hf_to_gguf.py)
#     build/bin/  libllama.so, libggml*.so
#     .stamp      written last: its presence means the build is complete
# Usage: build_llama_cpp.sh VERSION PYTHON   (prints the cache directory on its last line)
set -euo pipefail
ver=${1:?llama-cpp-python version}
py=${2:-python3}
cache=${STRAP_LLAMA_CACHE:-$HOME/.cache/strap-llm/llama.cpp-$ver}
if [ -f "$cache/.stamp" ]; then echo "$cache"; exit 0; fi
mkdir -p "$cache"
if [ ! -f "$cache/src/include/llama.h" ]; then
	dl=$(mktemp -d)
	trap 'rm -rf "$dl"' EXIT
	"$py" -m pip download --quiet --no-deps --no-binary :all: \
		-d "$dl" "llama-cpp-python==$ver"
	tar -xzf "$dl"/llama_cpp_python-"$ver".tar.gz -C "$dl"
	rm -rf "$cache/src" "$cache/llama-cpp-python"
	mv "$dl/llama_cpp_python-$ver/vendor/llama.cpp" "$cache/src"
	# The Python binding's own sources, kept for reference (docs/LLAMA_CPP.md, llama-cpp-python).
	mv "$dl/llama_cpp_python-$ver/llama_cpp" "$cache/llama-cpp-python"
fi
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# OpenMP stays on (llama.cpp's default): without it, and without a threadpool attached to the
# context, ggml creates and joins its worker threads for every graph computation, and an eval
# callback splits each graph into one computation per observed node (docs/LLAMA_CPP.md).
# GGML_NATIVE=OFF: the cache may be reused on another CPU of the same architecture (CI runners);
# AVX2/FMA/F16C are still enabled through GGML_AVX2 etc. on x86-64 (the machines here have them).
extra=()
case "$(uname -m)" in x86_64) extra=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON) ;; esac
nice -n 10 cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
	-DGGML_NATIVE=OFF "${extra[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON \
	"${launcher[@]}" >/dev/null
nice -n 10 cmake --build "$cache/build" --target llama -j"$(nproc)"
touch "$cache/.stamp"
echo "$cache"
