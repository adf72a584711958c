// The safetensors reader/writer: exact layout, round trip, and every corruption mode ending in a
// DataLoss that names the file.
#include "longhaul/supervisor/safetensors.h"

#include <cstdio>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/base/crc32c.h"
#include "longhaul/base/error.h"
#include "test_util.h"

namespace longhaul::supervisor {
namespace {

using ::testing::HasSubstr;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

Snapshot make_snapshot() {
  Snapshot s;
  s.step = 1234;
  s.reshape({
      TensorSpec{"transformer.wte.weight", DType::kF32, {2, 3}},
      TensorSpec{"transformer.h.0.attn.c_attn.bias", DType::kBF16, {5}},
      TensorSpec{"rng.state", DType::kU64, {2}},
      TensorSpec{"empty", DType::kI32, {0, 4}},
      TensorSpec{"scalar", DType::kF64, {}},
  });
  for (auto& b : s.buffers) {
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 7 + b.size());
  }
  s.metadata["data_position"] = "shard=3,offset=99";
  return s;
}

uint64_t header_len(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return n;
}

// Builds a file from a JSON header and a data section, the way another tool might.
std::string build_file(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(json.size() >> (8 * i));
  return out + json + data;
}

// The writer checksums large tensors piece by piece while writing them and fills the header in
// last (over placeholders of the same length): the header must still hold each tensor's CRC-32C
// of its whole bytes, and the data must land where the header says, for tensors larger than a
// piece and a file larger than a writeback chunk. At 43 MiB the checksums are computed on the
// writer's helper thread; the small files of the other tests take the single-thread pass.
TEST(Safetensors, LargeTensorsWrittenInPiecesCarryTheirWholeChecksums) {
  TempDir dir;
  auto path = dir / "model.ckpt-7.safetensors";
  Snapshot s;
  s.step = 7;
  s.reshape({
      TensorSpec{"small", DType::kF32, {3}},
      TensorSpec{"pieces", DType::kF32, {(3 << 20) / 4 + 5}},  // 3 MiB + 20 bytes
      TensorSpec{"chunks", DType::kU8, {(40 << 20) + 3}},      // past one 32 MiB chunk
  });
  for (auto& b : s.buffers) {
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  }
  write_safetensors(path, s);

  SafetensorsReader r(path, {.require_checksums = true});
  r.verify_all();  // throws DataLoss on any mismatch
  const auto crcs = nlohmann::json::parse(r.metadata().at("crc32c"));
  for (size_t i = 0; i < s.specs.size(); ++i) {
    const auto& name = s.specs[i].name;
    auto data = r.data(name);
    ASSERT_EQ(data.size(), s.buffers[i].size()) << name;
    EXPECT_EQ(std::memcmp(data.data(), s.buffers[i].data(), data.size()), 0) << name;
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc32c::value(s.buffers[i].data(), s.buffers[i].size()));
    EXPECT_EQ(crcs.at(name).get<std::string>(), hex) << name;
  }
}

// The writer says where its time went (what supervisor_bench reports): every phase is measured,
// none is negative, and together they fit in the whole call; a state of 16 MiB and more is
// checksummed on the helper thread, whose CPU time is reported.
TEST(Safetensors, WriteTimesAccountForTheWholeWrite) {
  TempDir dir;
  for (const int64_t n : {int64_t{1000}, int64_t{(20 << 20) + 3}}) {
    Snapshot s;
    s.reshape({TensorSpec{"a", DType::kU8, {n}}, TensorSpec{"b", DType::kF32, {7}}});
    SafetensorsWriteTimes t;
    write_safetensors(dir / ("model.ckpt-" + std::to_string(n) + ".safetensors"), s, {}, &t);
    const double parts = t.header_seconds + t.file.write_seconds + t.file.writeback_seconds +
                         t.file.fsync_seconds + t.file.rename_seconds + t.checksum_wait_seconds;
    for (double v :
         {t.header_seconds, t.file.write_seconds, t.file.writeback_seconds, t.file.fsync_seconds,
          t.file.rename_seconds, t.checksum_wait_seconds, t.checksum_seconds}) {
      EXPECT_GE(v, 0) << n;
    }
    EXPECT_GT(t.file.write_seconds, 0) << n;
    EXPECT_GT(t.file.fsync_seconds, 0) << n;
    EXPECT_LE(parts, t.total_seconds) << n;
    if (n > (16 << 20)) {
      EXPECT_GT(t.checksum_seconds, 0) << "the helper's CPU time";
    }
    SafetensorsReader(dir / ("model.ckpt-" + std::to_string(n) + ".safetensors"),
                      {.require_checksums = true})
        .verify_all();
  }
}

TEST(Safetensors, RoundTripKeepsNamesShapesBytesAndMetadata) {
  TempDir dir;
  auto path = dir / "model.ckpt-1234.safetensors";
  Snapshot s = make_snapshot();
  uint64_t size = write_safetensors(path, s);
  EXPECT_EQ(size, std::filesystem::file_size(path));

  SafetensorsReader r(path, {.require_checksums = true});
  EXPECT_EQ(r.path(), path.string());
  ASSERT_EQ(r.tensor_names().size(), s.specs.size());
  for (size_t i = 0; i < s.specs.size(); ++i) {
    EXPECT_EQ(r.tensor_names()[i], s.specs[i].name);  // written in order, read in offset order
    EXPECT_EQ(r.spec(s.specs[i].name).shape, s.specs[i].shape);
    EXPECT_EQ(r.spec(s.specs[i].name).dtype, s.specs[i].dtype);
    auto d = r.data(s.specs[i].name);
    ASSERT_EQ(d.size(), s.buffers[i].size());
    EXPECT_EQ(std::memcmp(d.data(), s.buffers[i].data(), d.size()), 0);
  }
  EXPECT_EQ(r.metadata().at("data_position"), "shard=3,offset=99");
  EXPECT_EQ(r.metadata().at("format"), "pt");  // Hugging Face transformers requires it
  EXPECT_EQ(r.global_step(), 1234);
  EXPECT_TRUE(r.contains("scalar"));
  EXPECT_FALSE(r.contains("nope"));
  EXPECT_NO_THROW(r.verify_all());
  EXPECT_THROW(r.data("nope"), NotFound);
}

TEST(Safetensors, LayoutFollowsTheFormatExactly) {
  TempDir dir;
  auto path = dir / "x.safetensors";
  Snapshot s = make_snapshot();
  write_safetensors(path, s);
  std::string bytes = read_bytes(path);
  uint64_t n = header_len(bytes);
  EXPECT_EQ((8 + n) % 8, 0u) << "header must be padded to a multiple of 8";
  std::string json = bytes.substr(8, n);
  EXPECT_EQ(json.front(), '{');
  auto last = json.find_last_not_of(' ');
  EXPECT_EQ(json[last], '}') << "padding must be spaces";
  auto header = nlohmann::json::parse(json);
  ASSERT_TRUE(header.contains("__metadata__"));
  for (auto& [k, v] : header["__metadata__"].items()) EXPECT_TRUE(v.is_string()) << k;
  auto crcs = nlohmann::json::parse(header["__metadata__"]["crc32c"].get<std::string>());
  uint64_t expect = 0;
  for (size_t i = 0; i < s.specs.size(); ++i) {
    const auto& e = header[s.specs[i].name];
    EXPECT_EQ(e["dtype"], std::string(dtype_name(s.specs[i].dtype)));
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), s.specs[i].shape);
    EXPECT_EQ(e["data_offsets"][0].get<uint64_t>(), expect) << "no gaps";
    expect += s.buffers[i].size();
    EXPECT_EQ(e["data_offsets"][1].get<uint64_t>(), expect);
    EXPECT_EQ(crcs[s.specs[i].name].get<std::string>().size(), 8u);
  }
  EXPECT_EQ(8 + n + expect, bytes.size()) << "data covers the rest of the file";
}

TEST(Safetensors, ReadsFilesFromOtherToolsWithoutChecksums) {
  TempDir dir;
  auto path = dir / "model.safetensors";
  // Hugging Face style: keys in any order, no crc32c.
  std::string json =
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  float a = 1.5f, b = -2.0f;
  std::string data(8, '\0');
  std::memcpy(data.data(), &a, 4);
  std::memcpy(data.data() + 4, &b, 4);
  write_bytes(path, build_file(json, data));
  SafetensorsReader r(path);
  EXPECT_EQ(r.tensor_names(), (std::vector<std::string>{"a", "b"}));
  float got = 0;
  std::memcpy(&got, r.data("b").data(), 4);
  EXPECT_EQ(got, -2.0f);
  EXPECT_THROW(SafetensorsReader(path, {.require_checksums = true}), DataLoss);
}

TEST(Safetensors, WriterRejectsMismatchedBuffers) {
  TempDir dir;
  Snapshot s = make_snapshot();
  s.buffers[0].pop_back();
  EXPECT_THROW(write_safetensors(dir / "bad.safetensors", s), InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.safetensors"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "no temp file may be left behind";
}

// Each corruption, applied to a good file, must give DataLoss naming the file.
struct Corruption {
  std::string name;
  std::function<std::string(std::string)> apply;
  std::string expect;            // substring of the message
  bool detected_lazily = false;  // by data()/verify_all() rather than by the constructor
};

class SafetensorsCorruption : public ::testing::TestWithParam<Corruption> {};

TEST_P(SafetensorsCorruption, IsDataLossNamingTheFile) {
  TempDir dir;
  auto path = dir / "model.ckpt-7.safetensors";
  write_safetensors(path, make_snapshot());
  write_bytes(path, GetParam().apply(read_bytes(path)));
  try {
    SafetensorsReader r(path, {.require_checksums = true});
    ASSERT_TRUE(GetParam().detected_lazily) << "constructor accepted a corrupt file";
    EXPECT_THROW(r.data("transformer.wte.weight"), DataLoss);
    r.verify_all();
    FAIL() << "verify_all accepted a corrupt file";
  } catch (const DataLoss& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
    EXPECT_THAT(e.what(), HasSubstr(GetParam().expect));
  }
}

std::string set_header(std::string bytes, const std::function<void(nlohmann::json&)>& edit,
                       int64_t data_delta = 0) {
  uint64_t n = header_len(bytes);
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  edit(h);
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string data = bytes.substr(8 + n);
  if (data_delta > 0) data.append(static_cast<size_t>(data_delta), '\0');
  return build_file(json, data);
}

INSTANTIATE_TEST_SUITE_P(
    AllModes, SafetensorsCorruption,
    ::testing::Values(
        Corruption{"TruncatedData", [](std::string b) { return b.substr(0, b.size() - 3); },
                   "outside"},
        Corruption{"TruncatedInHeader", [](std::string b) { return b.substr(0, 20); },
                   "runs past the end"},
        Corruption{"TruncatedBelowLength", [](std::string b) { return b.substr(0, 5); },
                   "less than the 8-byte"},
        Corruption{"EmptyFile", [](std::string) { return std::string(); }, "0 bytes"},
        Corruption{"HugeHeaderLength",
                   [](std::string b) {
                     b[7] = '\x7f';
                     return b;
                   },
                   "implausible"},
        Corruption{"GarbledHeader",
                   [](std::string b) {
                     b[9] = '#';  // the quote opening the first key
                     return b;
                   },
                   "not valid JSON"},
        Corruption{"HeaderNotObject",
                   [](std::string b) {
                     b[8] = '[';
                     return b;
                   },
                   "does not start with a JSON object"},
        Corruption{"BadCrc",
                   [](std::string b) {
                     b[b.size() - 40] ^= 0x01;  // inside the data section
                     return b;
                   },
                   "CRC-32C", true},
        Corruption{"GapBetweenTensors",
                   [](std::string b) {
                     return set_header(
                         b,
                         [](nlohmann::json& h) {
                           // Shift every tensor after the first one by 4 bytes.
                           for (auto& [k, v] : h.items()) {
                             if (k == "__metadata__") continue;
                             if (v["data_offsets"][0].get<uint64_t>() == 0) continue;
                             v["data_offsets"][0] = v["data_offsets"][0].get<uint64_t>() + 4;
                             v["data_offsets"][1] = v["data_offsets"][1].get<uint64_t>() + 4;
                           }
                         },
                         4);
                   },
                   "gap of 4 bytes"},
        Corruption{"TrailingBytes", [](std::string b) { return b + std::string(8, '\0'); },
                   "not covered"},
        Corruption{"OverlappingTensors",
                   [](std::string b) {
                     return set_header(
                         b, [](nlohmann::json& h) { h["dup"] = h["transformer.wte.weight"]; });
                   },
                   "overlaps"},
        Corruption{"UnknownDtype",
                   [](std::string b) {
                     return set_header(b, [](nlohmann::json& h) {
                       h["transformer.wte.weight"]["dtype"] = "F31";
                     });
                   },
                   "unknown safetensors dtype"},
        Corruption{"ShapeDisagreesWithOffsets",
                   [](std::string b) {
                     return set_header(b, [](nlohmann::json& h) {
                       h["transformer.wte.weight"]["shape"] = {3, 3};
                     });
                   },
                   "needs"},
        Corruption{"MissingChecksum",
                   [](std::string b) {
                     return set_header(b, [](nlohmann::json& h) {
                       h["__metadata__"].erase("crc32c");
                       h["__metadata__"].erase("metadata_crc32c");
                     });
                   },
                   "no CRC-32C"},
        // Regression: metadata (the step, the data position) was not covered by any checksum.
        Corruption{"MetadataValueAltered",
                   [](std::string b) {
                     return set_header(
                         b, [](nlohmann::json& h) { h["__metadata__"]["global_step"] = "999"; });
                   },
                   "metadata_crc32c"},
        Corruption{"MetadataNotString",
                   [](std::string b) {
                     return set_header(b,
                                       [](nlohmann::json& h) { h["__metadata__"]["format"] = 3; });
                   },
                   "not a string"}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

TEST(CheckCompatible, NamesTheFirstMismatchedTensor) {
  TempDir dir;
  auto path = dir / "model.ckpt-1.safetensors";
  Snapshot s;
  s.reshape(testing::toy_specs(3));
  write_safetensors(path, s);
  SafetensorsReader r(path);
  EXPECT_NO_THROW(check_compatible(testing::toy_specs(3), r));
  try {
    check_compatible(testing::toy_specs(4), r);
    FAIL();
  } catch (const FailedPrecondition& e) {
    EXPECT_THAT(e.what(), HasSubstr("transformer.wte.weight has shape [4, 3] in the checkpoint "
                                    "but the model expects [4, 4]"));
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
  }
  auto specs = testing::toy_specs(3);
  specs[1].dtype = DType::kBF16;
  EXPECT_THROW(check_compatible(specs, r), FailedPrecondition);
  specs = testing::toy_specs(3);
  specs.push_back(TensorSpec{"lm_head.weight", DType::kF32, {1}});
  try {
    check_compatible(specs, r);
    FAIL();
  } catch (const FailedPrecondition& e) {
    EXPECT_THAT(e.what(), HasSubstr("lm_head.weight is missing"));
  }
}

TEST(TrainingStateHelpers, DtypesAndSnapshotBuffers) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_name(DType::kBool), "BOOL");
  EXPECT_EQ(dtype_from_name("F16"), DType::kF16);
  EXPECT_THROW(dtype_from_name("F8"), InvalidArgument);
  EXPECT_EQ((TensorSpec{"x", DType::kF32, {2, 3, 4}}.numel()), 24);
  EXPECT_EQ((TensorSpec{"x", DType::kF32, {}}.numel()), 1);
  Snapshot s;
  s.reshape(testing::toy_specs(3));
  auto* data = s.buffers[0].data();
  s.reshape(testing::toy_specs(3));
  EXPECT_EQ(s.buffers[0].data(), data) << "same shape must reuse the buffer";
  EXPECT_EQ(s.buffer("transformer.wte.weight").size(), 4u * 3 * 4);
  EXPECT_THROW(s.buffer("nope"), NotFound);
}

}  // namespace
}  // namespace longhaul::supervisor
