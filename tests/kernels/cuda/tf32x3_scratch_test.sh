#!/usr/bin/env bash
# registry_test's 3xTF32 workspace case in the split form (LOOM_TF32X3=split), with the split
# in the call's workspace, and with it in the stream scratch (LOOM_TF32X3_WORKSPACE=scratch:
# the kernels then ask for no split workspace). $1: registry_test. Each run is one process:
# both variables are read once per process.
set -euo pipefail
LOOM_TF32X3="split" "$1" --gtest_filter='FamilyRegistry.Tf32x3WorkspaceIsTheSplitOperands'
LOOM_TF32X3="split" LOOM_TF32X3_WORKSPACE=scratch \
  exec "$1" --gtest_filter='FamilyRegistry.Tf32x3WorkspaceIsTheSplitOperands'
