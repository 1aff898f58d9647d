// The loom SDK: everything a plugin includes.
//
// The boundary (what crosses between the core and a plugin) is in loom/*.h and
// loom/kinds/*.h: plain value structs and pure abstract `noexcept` interfaces. The header-
// only C++ conveniences that make writing a plugin feel like ordinary C++ are in
// loom/cpp/*.h. Start with loom/cpp/plugin.h, which has an example.
#pragma once

#include "loom/cpp/comm_work.h"
#include "loom/cpp/error.h"
#include "loom/cpp/fingerprint.h"
#include "loom/cpp/json_input.h"
#include "loom/cpp/object.h"
#include "loom/cpp/plugin.h"
#include "loom/host.h"
#include "loom/kernel.h"
#include "loom/kinds.h"
#include "loom/plugin.h"
#include "loom/registry.h"
#include "loom/status.h"
#include "loom/types.h"
#include "loom/version.h"
