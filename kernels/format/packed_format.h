// Packed-weight format: the contract between the weight packer and every
// kernel that reads it.
//
// A packed buffer is a fixed 64-byte header followed by a body. The header is
// self-describing and versioned, so a buffer can be validated on every call
// and carried between machines (a format packed on one CPU runs on any other
// through the reference kernel).
//
// Body layout (one layout family, parametrised by nr = rows per block):
//   for each block of nr output rows (n is padded up to a multiple of nr):
//     for each group g of group_size k-values:
//       for each superblock of kb k-values (kb = 32 when 32 | group_size, else 16):
//         bit planes of the stored weights (see below)
//       scales[nr]            float32
//       zeros[nr]             int8, padded to 4 bytes   (only with zero points)
//     row_sums[nr]            float32: sum_g scale_g * (sum_i w_i - group_size * zero_g)
//     bias[nr]                float32                   (only with bias)
// With bfloat16 scales (scale_type 1: every scale is a bfloat16 value, stored
// as its upper 16 bits) the scales and zero points of a block move out of the
// groups into arrays after them, so that a group is only its planes and every
// 64-byte unit stays 64-byte aligned:
//   for each block: groups (planes only); scales[groups][nr] bfloat16;
//                   zeros[groups][nr padded to 4] int8; row_sums; bias
// Kernels find a group's scales and zero points with scales_of / zeros_of.
//
// Stored weight values are unsigned: u = w + 2^(bits-1), in [0, 2^bits - 1].
// A superblock holds kb/4 "blocks" of nr rows x kr=4 consecutive k-values; a
// block is nr*4 bytes when expanded to one byte per value, row r's four values
// at bytes [4r, 4r+4). Bits are stored in planes: 8 bits as one plane of 8;
// otherwise bits are split into planes of 4, 2 and 1 bits (low bits first,
// e.g. 7 = 4+2+1, 3 = 2+1). In a plane of p bits, block j lives in plane unit
// (j*p)/8 at bit shift (j*p)%8; a unit is nr*4 bytes. Kernels rebuild a block
// with one shift and one mask per plane, which is what SIMD unpacking wants:
// it is the same for every row, and for nr=16 one unit is one 512-bit vector
// (or two 256-bit vectors, or four 128-bit vectors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/generated/format_limits.h"  // kMaxBits, kMaxDim, kGroupMultiple, kMaxGroupSize

namespace torchao_kernels {

constexpr uint32_t kPackedMagic = 0x4b4f4154u;  // "TAOK" little endian
constexpr uint16_t kPackedAbiVersion = 1;
constexpr int kPackedHeaderBytes = 64;
constexpr int kKr = 4;

// How the per-group scales are stored. The values are float32 in every case
// (semantics do not change): bfloat16 storage holds the upper 16 bits of
// float32 scales whose lower 16 bits are zero, which saves 2 bytes per row
// and group of the memory-bound GEMV stream (10% of the bytes at 4 bits,
// group 32).
enum class ScaleType : uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
};

enum class FormatId : uint16_t {
  kN1K4 = 1,   // portable: one row per block
  kN16K4 = 2,  // 16 rows per block: x86 AVX2 / AVX-VNNI / AVX512-VNNI
};

struct FormatInfo {
  FormatId id;
  const char* name;
  int nr;
  const char* description;
};

// All formats this build knows, in id order.
const FormatInfo* formats(int* count);
const FormatInfo* find_format(FormatId id);
const FormatInfo* find_format(const std::string& name);

#pragma pack(push, 1)
struct PackedHeader {
  uint32_t magic;
  uint16_t abi_version;
  uint16_t header_bytes;
  uint16_t format_id;
  uint8_t weight_nbit;
  uint8_t flags;  // bit 0: zero points, bit 1: bias
  int32_t n;
  int32_t k;
  int32_t group_size;
  uint16_t nr;
  uint8_t kr;
  uint8_t kb;
  uint8_t scale_type;  // ScaleType: 0 float32, 1 bfloat16
  uint8_t reserved0[3];
  uint64_t body_bytes;
  uint32_t header_checksum;  // over all previous bytes
  uint8_t reserved1[20];
};
#pragma pack(pop)
static_assert(sizeof(PackedHeader) == kPackedHeaderBytes, "header is 64 bytes");

constexpr uint8_t kFlagZeros = 1;
constexpr uint8_t kFlagBias = 2;
// Weight values only (torchao::_pack_embedding_{b}bit): the body is the bit
// planes of each row, one group spanning k, and nothing else; the scales and
// zero points come with every lookup. Only embedding lookups read it.
constexpr uint8_t kFlagQvalsOnly = 4;

// One stored scale as float32: bfloat16 scales are its upper 16 bits.
inline float load_scale(const uint8_t* p, bool bf16) {
  uint32_t bits = 0;
  if (bf16) {
    uint16_t hi;
    std::memcpy(&hi, p, 2);
    bits = uint32_t{hi} << 16;
  } else {
    std::memcpy(&bits, p, 4);
  }
  float s;
  std::memcpy(&s, &bits, 4);
  return s;
}

// Geometry of one packed layout, derived from the header parameters.
struct PackedLayout {
  int bits = 0;
  int n = 0, k = 0, group_size = 0;
  bool has_zeros = false, has_bias = false;
  int nr = 0, kb = 0;
  ScaleType scale_type = ScaleType::kFloat32;
  bool scales_bf16 = false;  // scale_type == kBFloat16
  bool qvals_only = false;   // kFlagQvalsOnly: planes only, group_size == k
  int groups = 0;            // k / group_size
  int superblocks = 0;       // group_size / kb
  int n_blocks = 0;          // ceil(n / nr)
  int64_t superblock_bytes = 0;
  // Group g's scales are at group + scales_offset + g * scales_skew (group:
  // the address of its first plane byte); zero points likewise. The skews
  // are 0 when scales and zero points sit inside each group (float32).
  int64_t scales_offset = 0;
  int64_t scales_skew = 0;
  int64_t zeros_offset = 0;
  int64_t zeros_skew = 0;
  int64_t group_bytes = 0;
  int64_t row_sums_offset = 0;  // within a block
  int64_t bias_offset = 0;      // within a block
  int64_t block_bytes = 0;
  int64_t body_bytes = 0;

  static PackedLayout make(FormatId format, int bits, int n, int k, int group_size,
                           bool has_zeros, bool has_bias,
                           ScaleType scale_type = ScaleType::kFloat32);
  // The weights-only layout (kFlagQvalsOnly) of format n1k4: row after row,
  // each row the planes of k / kb superblocks (kb = 32 when 32 | k, else 16).
  static PackedLayout make_qvals_only(int bits, int n, int k);
  const uint8_t* scales_of(const uint8_t* group, int g) const {
    return group + scales_offset + g * scales_skew;
  }
  const uint8_t* zeros_of(const uint8_t* group, int g) const {
    return group + zeros_offset + g * zeros_skew;
  }
  // Scale of row rr (within its block) in group g, which starts at `group`.
  float scale(const uint8_t* group, int g, int rr) const {
    return load_scale(scales_of(group, g) + (scales_bf16 ? 2 : 4) * rr, scales_bf16);
  }
};

// kBFloat16 when every one of the `count` scales is a bfloat16 value (its
// lower 16 bits are zero, so storing the upper 16 loses nothing), else kFloat32.
ScaleType lossless_scale_type(const float* scales, int64_t count);

// Plane decomposition of a bit width: planes(bits)[i] = bits of plane i (0 ends).
struct BitPlanes {
  int count;
  int bits[3];
  int shift[3];  // where the plane's bits sit in the value
};
BitPlanes bit_planes(int bits);
// Units (of nr*4 bytes) a plane of p bits takes in a superblock of kb values.
inline int plane_units(int p, int kb) { return ((kb / kKr) * p + 7) / 8; }

// Checks argument ranges shared by packing and running; throws
// std::invalid_argument naming the argument and its value.
void check_weight_params(int bits, int64_t n, int64_t k, int64_t group_size);
// The same for a weights-only (embedding) table: k must be a multiple of 16.
void check_qvals_only_params(int bits, int64_t n, int64_t k);

PackedHeader make_header(FormatId format, const PackedLayout& layout);
uint32_t header_checksum(const PackedHeader& h);

// Validates a buffer and returns its header and layout. Throws
// std::invalid_argument with a message saying what is wrong (not a packed
// buffer, truncated, unknown format, newer ABI, inconsistent fields).
struct PackedView {
  PackedHeader header;
  PackedLayout layout;
  FormatId format;
  const uint8_t* body;
};
PackedView parse_packed(const void* data, size_t size);

}  // namespace torchao_kernels
