#!/usr/bin/env bash
# The llama.cpp peer for benchmarks: llama-cpp-python built from source for this CPU, in its own venv
# (.venv-llamacpp), never a test dependency. About 6 minutes on 2 cores; idempotent.
#   benchmarks/peers/setup_llamacpp.sh      then benchmarks use .venv-llamacpp/bin/python
# The build is GGML_NATIVE=ON (everything this CPU has), except on CPUs with AMX: there ggml's AMX matrix
# path faults (general protection fault in libggml-cpu on any batch of more than one token, seen on a 2-core
# Xeon VM), so the same ISA is named explicitly (AVX-512 with VNNI, BF16, VBMI where present) without AMX.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VENV=.venv-llamacpp
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "[llamacpp] ready: $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
ARGS="-DGGML_NATIVE=ON"
if grep -q -w amx_tile /proc/cpuinfo; then
  ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  ARGS="$ARGS -DGGML_AVX512=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  for f in avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx512vbmi:AVX512_VBMI; do
    grep -q -w "${f%%:*}" /proc/cpuinfo && ARGS="$ARGS -DGGML_${f##*:}=ON"
  done
fi
echo "[llamacpp] building llama-cpp-python==0.3.36 from source with $ARGS (~6 min)"
CMAKE_ARGS="$ARGS" "$VENV/bin/python" -m pip install --disable-pip-version-check \
  --no-binary llama-cpp-python --no-cache-dir llama-cpp-python==0.3.36 numpy
echo "[llamacpp] ready: $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
