# Sourced by part1.sh / part2.sh on the device machine. Sets B (binaries) and RUN (how to start them).
B=$DEV/bin; L=$DEV/lib
if env LD_LIBRARY_PATH=$L $B/kernel_ops_test --gtest_list_tests >/dev/null 2>&1; then
  RUN="env LD_LIBRARY_PATH=$L"; echo "run mode: device libc + carried absl"
else
  RUN="$L/sys/ld-linux-x86-64.so.2 --library-path $L/sys:$L"; echo "run mode: carried loader + libc"
fi
