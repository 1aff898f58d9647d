// The dtype names of loom/types.h: dtype_from_name is dtype_name's inverse over every dtype,
// and refuses (kInvalid) null, unknown, differently spelled and the "invalid" name.
#include "loom/types.h"

#include <gtest/gtest.h>

#include <string>

namespace loom {
namespace {

TEST(DtypeNames, FromNameInvertsName) {
  int named = 0;
  for (int32_t value = 1; value <= static_cast<int32_t>(DType::kF8E8M0); ++value) {
    const DType dtype = static_cast<DType>(value);
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype) << dtype_name(dtype);
    ++named;
  }
  EXPECT_EQ(named, 14);
  EXPECT_EQ(dtype_from_name("f32"), DType::kF32);
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("fp8_e4m3"), DType::kF8E4M3);
  EXPECT_EQ(dtype_from_name("fp8_e8m0"), DType::kF8E8M0);
  EXPECT_EQ(dtype_from_name("bool"), DType::kBool);
}

TEST(DtypeNames, UnknownNamesAreInvalid) {
  EXPECT_EQ(dtype_from_name(nullptr), DType::kInvalid);
  for (const char* name : {"", "invalid", "F32", "f3", "f322", "bf16 ", "float32", "fp8"})
    EXPECT_EQ(dtype_from_name(name), DType::kInvalid) << "'" << name << "'";
}

}  // namespace
}  // namespace loom
