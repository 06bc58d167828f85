# Sourced by part1.sh / part2.sh on the device machine. Sets B (binaries) and RUN (how to start them).
B=$DEV/bin; L=$DEV/lib
[ -d "$B" ] || tar xzf "$DEV/payload.tgz" -C "$DEV"  # bundle.sh packed bin/ and lib/
# cuBLAS and NCCL are not carried (hundreds of MiB): the machine's CUDA toolkit, or the NVIDIA
# wheels PyTorch installs, have them.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib")))' 2>/dev/null); do
  if [ -e "$d/libcublas.so.13" ] || [ -e "$d/libnccl.so.2" ] || [ -e "$d/libcublasLt.so.13" ]; then L="$L:$d"; fi
done
echo "library path: $L"
if env LD_LIBRARY_PATH=$L $B/llama_model_test --gtest_list_tests >/dev/null 2>&1; then
  RUN="env LD_LIBRARY_PATH=$L"; echo "run mode: device libc + carried absl"
else
  RUN="$DEV/lib/sys/ld-linux-x86-64.so.2 --library-path $DEV/lib/sys:$L"; echo "run mode: carried loader + libc"
fi
