# Reads the output of gtest binaries; prints one line "Suite.Test: reason" for each test that
# was skipped (GTEST_SKIP), except those skipped because the machine has fewer GPUs than they
# need ("needs 2 GPUs"). Used by tools/gpu_check and the GPU bundle's run.sh, where a skip
# means a GPU case did not run and must count against the run.
#
#   awk -f tools/gtest_skips.awk test.log | wc -l
/: Skipped$/ { in_skip = 1; reason = ""; next }
/^\[  SKIPPED \] [^ ]+ \([0-9]+ ms\)$/ {
  if (reason !~ /needs [0-9]+ GPUs/) print $4 ": " (reason == "" ? "(no reason given)" : reason)
  in_skip = 0; reason = ""; next
}
in_skip && NF > 0 { reason = reason (reason == "" ? "" : " ") $0 }
