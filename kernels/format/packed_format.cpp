#include "kernels/format/packed_format.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

namespace torchao_kernels {

namespace {
const FormatInfo kFormats[] = {
    {FormatId::kN1K4, "n1k4", 1,
     "portable layout, one output row per block; read by the reference kernel on any CPU"},
    {FormatId::kN16K4, "n16k4", 16,
     "16 output rows x 4 k-values per block: one 512-bit / two 256-bit vectors per block unit "
     "(x86 AVX2, AVX-VNNI, AVX512-VNNI)"},
};

// Messages are streamed inside the failing branch only: constructing a
// std::ostringstream costs ~0.2 us, and parse_packed runs on every op call.
[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void check_bits(int bits) {
  if (bits < 1 || bits > kMaxBits) {
    std::ostringstream os;
    os << "weight_nbit must be in 1.." << kMaxBits << ", got " << bits;
    fail(os.str());
  }
}

}  // namespace

const FormatInfo* formats(int* count) {
  *count = static_cast<int>(sizeof(kFormats) / sizeof(kFormats[0]));
  return kFormats;
}

const FormatInfo* find_format(FormatId id) {
  for (const auto& f : kFormats)
    if (f.id == id) return &f;
  return nullptr;
}

const FormatInfo* find_format(const std::string& name) {
  for (const auto& f : kFormats)
    if (name == f.name) return &f;
  return nullptr;
}

BitPlanes bit_planes(int bits) {
  BitPlanes p{};
  if (bits == 8) {
    p.count = 1;
    p.bits[0] = 8;
    p.shift[0] = 0;
    return p;
  }
  int shift = 0;
  for (int b : {4, 2, 1}) {
    if (bits - shift >= b) {
      p.bits[p.count] = b;
      p.shift[p.count] = shift;
      ++p.count;
      shift += b;
    }
  }
  return p;
}

void check_weight_params(int bits, int64_t n, int64_t k, int64_t group_size) {
  check_bits(bits);
  if (n < 1 || n > kMaxDim) {
    std::ostringstream os;
    os << "n must be in 1.." << kMaxDimText << ", got " << n;
    fail(os.str());
  }
  if (k < 1 || k > kMaxDim) {
    std::ostringstream os;
    os << "k must be in 1.." << kMaxDimText << ", got " << k;
    fail(os.str());
  }
  if (group_size < kGroupMultiple || group_size % kGroupMultiple != 0) {
    std::ostringstream os;
    os << "group_size must be a positive multiple of " << kGroupMultiple << ", got " << group_size;
    fail(os.str());
  }
  if (k % group_size != 0) {
    std::ostringstream os;
    os << "group_size must divide k: group_size=" << group_size << ", k=" << k;
    fail(os.str());
  }
  if (group_size > kMaxGroupSize) {
    std::ostringstream os;
    os << "group_size must be at most " << kMaxGroupSize << " (" << kMaxGroupSizeWhy << "), got " << group_size;
    fail(os.str());
  }
}

void check_qvals_only_params(int bits, int64_t n, int64_t k) {
  check_bits(bits);
  if (n < 1 || n > kMaxDim) {
    std::ostringstream os;
    os << "num_embeddings must be in 1.." << kMaxDimText << ", got " << n;
    fail(os.str());
  }
  if (k < kGroupMultiple || k > kMaxDim || k % kGroupMultiple != 0) {
    std::ostringstream os;
    os << "embedding_dim must be a positive multiple of " << kGroupMultiple << " (at most " << kMaxDimText
       << "), got " << k;
    fail(os.str());
  }
}

PackedLayout PackedLayout::make_qvals_only(int bits, int n, int k) {
  check_qvals_only_params(bits, n, k);
  PackedLayout l;
  l.bits = bits;
  l.n = n;
  l.k = k;
  l.group_size = k;
  l.qvals_only = true;
  l.nr = 1;
  l.kb = k % 32 == 0 ? 32 : 16;
  l.groups = 1;
  l.superblocks = k / l.kb;
  l.n_blocks = n;
  const BitPlanes planes = bit_planes(bits);
  int units = 0;
  for (int i = 0; i < planes.count; ++i) units += plane_units(planes.bits[i], l.kb);
  l.superblock_bytes = int64_t{units} * kKr;
  l.group_bytes = l.superblock_bytes * l.superblocks;
  l.scales_offset = l.zeros_offset = l.group_bytes;  // no scales or zero points
  l.row_sums_offset = l.bias_offset = l.group_bytes;
  l.block_bytes = l.group_bytes;
  l.body_bytes = l.block_bytes * n;
  return l;
}

PackedLayout PackedLayout::make(FormatId format, int bits, int n, int k, int group_size,
                                bool has_zeros, bool has_bias, ScaleType scale_type) {
  check_weight_params(bits, n, k, group_size);
  const FormatInfo* f = find_format(format);
  if (!f) fail("unknown packed-weight format id " + std::to_string(static_cast<int>(format)));
  PackedLayout l;
  l.bits = bits;
  l.n = n;
  l.k = k;
  l.group_size = group_size;
  l.has_zeros = has_zeros;
  l.has_bias = has_bias;
  l.nr = f->nr;
  l.scale_type = scale_type;
  l.scales_bf16 = scale_type == ScaleType::kBFloat16;
  l.kb = group_size % 32 == 0 ? 32 : 16;
  l.groups = k / group_size;
  l.superblocks = group_size / l.kb;
  l.n_blocks = (n + l.nr - 1) / l.nr;
  const BitPlanes planes = bit_planes(bits);
  int units = 0;
  for (int i = 0; i < planes.count; ++i) units += plane_units(planes.bits[i], l.kb);
  const int64_t unit_bytes = int64_t{l.nr} * kKr;
  l.superblock_bytes = units * unit_bytes;
  const int64_t planes_bytes = l.superblock_bytes * l.superblocks;
  const int64_t zeros_bytes = has_zeros ? ((l.nr + 3) / 4) * 4 : 0;
  int64_t groups_end;
  if (l.scales_bf16) {
    // Planes only in a group; scales and zero points in per-block arrays.
    l.group_bytes = planes_bytes;
    const int64_t planes_end = l.group_bytes * l.groups;
    l.scales_offset = planes_end;
    l.scales_skew = 2 * int64_t{l.nr} - l.group_bytes;
    l.zeros_offset = planes_end + 2 * int64_t{l.nr} * l.groups;
    l.zeros_skew = zeros_bytes - l.group_bytes;
    groups_end = l.zeros_offset + zeros_bytes * l.groups;
  } else {
    l.scales_offset = planes_bytes;
    l.zeros_offset = l.scales_offset + 4 * int64_t{l.nr};
    l.group_bytes = l.zeros_offset + zeros_bytes;
    groups_end = l.group_bytes * l.groups;
  }
  l.row_sums_offset = groups_end;
  l.bias_offset = l.row_sums_offset + 4 * int64_t{l.nr};
  l.block_bytes = l.bias_offset + (has_bias ? 4 * int64_t{l.nr} : 0);
  l.body_bytes = l.block_bytes * l.n_blocks;
  return l;
}

ScaleType lossless_scale_type(const float* scales, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &scales[i], 4);
    if (bits & 0xffffu) return ScaleType::kFloat32;
  }
  return ScaleType::kBFloat16;
}

uint32_t header_checksum(const PackedHeader& h) {
  // FNV-1a over the bytes before the checksum field.
  const auto* p = reinterpret_cast<const uint8_t*>(&h);
  uint32_t x = 2166136261u;
  for (size_t i = 0; i < offsetof(PackedHeader, header_checksum); ++i) {
    x ^= p[i];
    x *= 16777619u;
  }
  return x;
}

PackedHeader make_header(FormatId format, const PackedLayout& l) {
  PackedHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kPackedMagic;
  h.abi_version = kPackedAbiVersion;
  h.header_bytes = kPackedHeaderBytes;
  h.format_id = static_cast<uint16_t>(format);
  h.weight_nbit = static_cast<uint8_t>(l.bits);
  h.flags = (l.has_zeros ? kFlagZeros : 0) | (l.has_bias ? kFlagBias : 0) |
            (l.qvals_only ? kFlagQvalsOnly : 0);
  h.n = l.n;
  h.k = l.k;
  h.group_size = l.group_size;
  h.nr = static_cast<uint16_t>(l.nr);
  h.kr = kKr;
  h.kb = static_cast<uint8_t>(l.kb);
  h.scale_type = static_cast<uint8_t>(l.scale_type);
  h.body_bytes = static_cast<uint64_t>(l.body_bytes);
  h.header_checksum = header_checksum(h);
  return h;
}

PackedView parse_packed(const void* data, size_t size) {
  if (size < sizeof(PackedHeader)) {
    std::ostringstream os;
    os << "packed_weights is not a torchao_kernels packed buffer: " << size
       << " bytes, shorter than the " << kPackedHeaderBytes << "-byte header";
    fail(os.str());
  }
  PackedView v;
  std::memcpy(&v.header, data, sizeof(PackedHeader));
  const PackedHeader& h = v.header;
  if (h.magic != kPackedMagic) {
    fail("packed_weights is not a torchao_kernels packed buffer (bad magic); pack weights with "
         "torchao::pack_8bit_act_xbit_weight or torchao_kernels.pack");
  }
  if (h.abi_version != kPackedAbiVersion) {
    std::ostringstream os;
    os << "packed_weights has format ABI version " << h.abi_version
       << (h.abi_version > kPackedAbiVersion ? " (newer than this build)" : "")
       << "; this build of torchao_kernels reads ABI version " << kPackedAbiVersion
       << " only: repack the weights with this version";
    fail(os.str());
  }
  if (h.header_bytes != kPackedHeaderBytes || h.header_checksum != header_checksum(h)) {
    fail("packed_weights header is corrupt (checksum mismatch)");
  }
  const FormatInfo* f = find_format(static_cast<FormatId>(h.format_id));
  if (!f) {
    std::ostringstream os;
    os << "packed_weights uses format id " << h.format_id << ", unknown to this build; it knows:";
    int count;
    const FormatInfo* all = formats(&count);
    for (int i = 0; i < count; ++i) os << " " << all[i].name << " (id " << int(all[i].id) << ")";
    fail(os.str());
  }
  v.format = f->id;
  if (h.scale_type > static_cast<uint8_t>(ScaleType::kBFloat16)) {
    std::ostringstream os;
    os << "packed_weights has scale type " << int(h.scale_type)
       << ", unknown to this build (0 = float32, 1 = bfloat16)";
    fail(os.str());
  }
  if (h.flags & kFlagQvalsOnly) {
    if (f->id != FormatId::kN1K4 || (h.flags & (kFlagZeros | kFlagBias)) || h.group_size != h.k ||
        h.scale_type != 0)
      fail("packed_weights header has a weights-only (embedding) flag inconsistent with its "
           "other fields");
    v.layout = PackedLayout::make_qvals_only(h.weight_nbit, h.n, h.k);
  } else {
    v.layout = PackedLayout::make(f->id, h.weight_nbit, h.n, h.k, h.group_size,
                                  (h.flags & kFlagZeros) != 0, (h.flags & kFlagBias) != 0,
                                  static_cast<ScaleType>(h.scale_type));
  }
  if (h.nr != v.layout.nr || h.kr != kKr || h.kb != v.layout.kb ||
      (h.flags & ~(kFlagZeros | kFlagBias | kFlagQvalsOnly)) != 0) {
    fail("packed_weights header has tile parameters inconsistent with its format " +
         std::string(f->name));
  }
  if (h.body_bytes != static_cast<uint64_t>(v.layout.body_bytes) ||
      size < sizeof(PackedHeader) + v.layout.body_bytes) {
    std::ostringstream os;
    os << "packed_weights is truncated or inconsistent: header says " << h.body_bytes
       << " body bytes, layout needs " << v.layout.body_bytes << ", buffer has "
       << (size - sizeof(PackedHeader));
    fail(os.str());
  }
  v.body = static_cast<const uint8_t*>(data) + sizeof(PackedHeader);
  return v;
}

}  // namespace torchao_kernels
