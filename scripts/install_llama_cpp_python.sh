#!/usr/bin/env bash
# Opt-in, not part of CI: builds llama-cpp-python (PyPI ships it as source only for Linux
# x86-64) into a git-ignored venv so that `specd-bench` can print llama.cpp's decode and
# prefill figures next to ours. Prints the venv's interpreter path; pass it to specd-bench
# with --llama-cpp-python PATH or SPECD_LLAMA_CPP_PYTHON=PATH. Idempotent.
#   scripts/install_llama_cpp_python.sh [VENV_DIR]       (default .venv-llama)
# The CPU-only compile of the vendored llama.cpp takes ~10-20 min on one core.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-llama}"
# Pinned: the version whose figures are in docs/PERFORMANCE.md.
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
py="$(cd "$venv" && pwd)/bin/python"
have="$("$py" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)"
if [ "$have" != "$version" ]; then
  # CPU only, tuned for this machine (GGML_NATIVE = -march=native, as our kernels are);
  # skip the multimodal library, tests, examples, tools and server: only libllama is needed.
  # AMX off: on the Sapphire Rapids development machine (2026-12-02) ggml's AMX MatMul
  # (ggml_backend_amx_mul_mat) crashed on the first eval of the default model; without it
  # ggml uses its AVX-512 VNNI kernels. -march=native turns AMX on, and explicit -mno-amx-*
  # win over it whatever their place on the command line.
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF \
-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \
-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \
-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF"
  # One compile job by default: the development machine has 2 shared cores.
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-1}"
  # --no-binary: PyPI has no Linux wheel, and a foreign wheel would not be -march=native.
  # --no-cache-dir: a wheel cached from other CMAKE_ARGS would be reused as is.
  nice -n 10 "$py" -m pip install --disable-pip-version-check --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$version" >&2
fi
"$py" -c 'import llama_cpp' >&2
echo "$py"
