#!/usr/bin/env bash
# registry_test's 3xTF32 workspace case under LOOM_TF32X3_WORKSPACE=scratch: the kernels ask
# for no split workspace (the split then goes to the stream scratch). $1: registry_test.
set -euo pipefail
LOOM_TF32X3_WORKSPACE=scratch exec "$1" --gtest_filter='FamilyRegistry.Tf32x3WorkspaceIsTheSplitOperands'
