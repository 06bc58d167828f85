# Sourced by part1.sh / part2.sh on the device machine. Unpacks the payload once and sets
#   B    the build tree (tests/, tools/, services/, loadtest/ as in a local build)
#   RUN  the prefix that starts a carried binary (device libc, or the carried loader and libc)
# and exports LD_LIBRARY_PATH so that scripts starting binaries themselves (run_cluster.sh) work.
# DEVICE=cpu runs the same script on a machine without a GPU (a dry run of the script's logic).
DEVICE=${DEVICE:-cuda}
unxz_to() {  # unxz_to FILE.xz|-  -> stdout (python's lzma where the xz tool is missing)
  if command -v xz >/dev/null; then xz -dc "$1"; else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1] if sys.argv[1] != "-" else sys.stdin.buffer), sys.stdout.buffer)' "$1"
  fi
}
[ -d "$DEV/build" ] || unxz_to "$DEV/payload.txz" | tar x -C "$DEV"
B=$DEV/build; L=$DEV/lib
# cuBLAS and NCCL are not carried (hundreds of MiB): the machine's CUDA toolkit or the NVIDIA
# wheels PyTorch installs have them.
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  d=$(ls -d /usr/local/cuda/lib64/$lib /usr/local/cuda/targets/x86_64-linux/lib/$lib \
        /usr/lib/x86_64-linux-gnu/$lib 2>/dev/null | head -1)
  [ -n "$d" ] || d=$(find /opt /usr/local /usr/lib -maxdepth 9 -name "$lib" 2>/dev/null | head -1)
  [ -n "$d" ] && case ":$L:" in *":$(dirname "$d"):"*) ;; *) L="$L:$(dirname "$d")" ;; esac
done
echo "library path: $L"
if env LD_LIBRARY_PATH=$L $B/tests/llama_model_test --gtest_list_tests >/dev/null 2>&1 &&
   env LD_LIBRARY_PATH=$L $B/services/specd-router --help >/dev/null 2>&1; then
  RUN="env LD_LIBRARY_PATH=$L"; export LD_LIBRARY_PATH=$L; echo "run mode: device libc + carried libraries"
else
  RUN="$DEV/lib/sys/ld-linux-x86-64.so.2 --library-path $DEV/lib/sys:$L"; echo "run mode: carried loader + libc"
  export LD_LIBRARY_PATH=$DEV/lib/sys:$L
fi
