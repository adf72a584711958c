// Event files: TensorBoard's file_version record byte for byte, the TFRecord framing with
// masked CRC-32C, reading back, corruption detection, one new file per writer.
#include "longhaul/supervisor/events.h"

#include <cfloat>
#include <cstring>
#include <map>
#include <regex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "test_util.h"

namespace longhaul::supervisor {
namespace {

using ::testing::HasSubstr;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// An independent bitwise CRC-32C (reflected polynomial 0x82F63B78), not the library's.
uint32_t reference_crc32c(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}
uint32_t reference_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}
std::string hand_framed(const std::string& data) {
  std::string len = le64(data.size());
  return len + le32(reference_mask(reference_crc32c(len))) + data +
         le32(reference_mask(reference_crc32c(data)));
}
// Event{wall_time, file_version: "brain.Event:2"} encoded by hand: field 1 fixed64, field 3
// length-delimited.
std::string hand_file_version_event(double wall_time) {
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  return "\x09" + le64(bits) + "\x1a\x0d" + "brain.Event:2";
}

TEST(Events, ReferenceCrcMatchesTheKnownCheckValue) {
  EXPECT_EQ(reference_crc32c("123456789"), 0xe3069283u);
}

TEST(Events, FileVersionRecordIsByteExact) {
  const double wall_time = 1763731200.5;
  std::string expected = hand_framed(hand_file_version_event(wall_time));
  ASSERT_EQ(expected.size(), 12u + 24u + 4u);

  tensorboard::Event e;
  e.set_wall_time(wall_time);
  e.set_file_version("brain.Event:2");
  EXPECT_EQ(frame_record(e.SerializeAsString()), expected);

  // The writer's first record: the same bytes, with the wall time it recorded.
  TempDir dir;
  EventsWriter w(dir.path(), {.flush_secs = 0});
  std::string bytes = read_bytes(w.path());
  ASSERT_GE(bytes.size(), 40u);
  ASSERT_EQ(bytes[12], '\x09');
  double written_time;
  std::memcpy(&written_time, bytes.data() + 13, 8);
  EXPECT_EQ(bytes.substr(0, 40), hand_framed(hand_file_version_event(written_time)));
  // The name's 10-digit seconds are the file_version event's wall time.
  std::string name = w.path().filename().string();
  EXPECT_EQ(name.substr(20, 10), std::to_string(static_cast<long long>(written_time)));
}

TEST(Events, FileNameFollowsTensorFlow) {
  TempDir dir;
  EventsWriter w(dir.path(), {.flush_secs = 0});
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::regex pattern("events\\.out\\.tfevents\\.[0-9]{10}\\." + std::string(host) + "\\." +
                     std::to_string(::getpid()) + "\\.[0-9]+");
  EXPECT_TRUE(std::regex_match(w.path().filename().string(), pattern)) << w.path();
  EXPECT_EQ(w.path().parent_path(), dir.path());
}

TEST(Events, EveryWriterOpensANewFileAndNeverAppends) {
  TempDir dir;
  std::filesystem::path first_path;
  std::string first_bytes;
  {
    EventsWriter w(dir.path());
    w.add_scalar("loss", 1.0, 1);
    w.close();
    first_path = w.path();
    first_bytes = read_bytes(first_path);
  }
  EventsWriter w2(dir.path());
  w2.add_scalar("loss", 0.5, 2);
  w2.flush();
  EXPECT_NE(w2.path(), first_path);
  EXPECT_EQ(read_bytes(first_path), first_bytes);
  EXPECT_EQ(list_events_files(dir.path()).size(), 2u);
  auto events = EventsReader::read_all(w2.path());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
}

TEST(Events, RecordsAreReadableAfterFlushAndRoundTrip) {
  TempDir dir;
  EventsWriter w(dir.path(), {.flush_secs = 0});
  w.add_session_log(tensorboard::SessionLog::START, 100);
  w.add_scalar("loss", 2.5, 101);
  std::vector<float> values = {-1.0f, 0.0f, 0.5f, 3.0f};
  w.add_histogram("weights", values, 102);
  w.add_session_log(tensorboard::SessionLog::CHECKPOINT, 103, "/l/model.ckpt-103.safetensors");
  w.flush();  // not closed: everything must already be readable
  auto events = EventsReader::read_all(w.path());
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[1].step(), 100);
  EXPECT_EQ(events[2].summary().value(0).tag(), "loss");
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].step(), 101);
  EXPECT_GT(events[2].wall_time(), 1.6e9);
  const auto& h = events[3].summary().value(0).histo();
  EXPECT_EQ(h.num(), 4);
  EXPECT_EQ(h.min(), -1.0);
  EXPECT_EQ(h.max(), 3.0);
  EXPECT_EQ(h.sum(), 2.5);
  EXPECT_EQ(h.sum_squares(), 10.25);
  EXPECT_EQ(events[4].session_log().checkpoint_path(), "/l/model.ckpt-103.safetensors");
  EXPECT_EQ(events[4].session_log().status(), tensorboard::SessionLog::CHECKPOINT);
  w.close();
  EXPECT_THROW(w.add_scalar("late", 1, 1), FailedPrecondition);
}

TEST(Events, BackgroundFlushWritesWithoutAnExplicitFlush) {
  TempDir dir;
  EventsWriter w(dir.path(), {.flush_secs = 0.01});
  w.add_scalar("loss", 1.0, 1);
  EXPECT_TRUE(testing::eventually(
      [&] {
        try {
          return EventsReader::read_all(w.path()).size() == 2;
        } catch (const DataLoss&) {
          return false;  // caught a record half written
        }
      },
      std::chrono::seconds(10)));
}

TEST(Events, ConcurrentWritersAndBackgroundFlushKeepEveryRecordIntact) {
  TempDir dir;
  EventsWriter w(dir.path(), {.flush_secs = 0.001});
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&w, t] {
      for (int i = 0; i < kPerThread; ++i) w.add_scalar("t" + std::to_string(t), i, i);
    });
  }
  for (auto& th : threads) th.join();
  w.close();
  auto events = EventsReader::read_all(w.path());
  ASSERT_EQ(events.size(), 1u + kThreads * kPerThread);
  std::map<std::string, int64_t> next;
  for (size_t i = 1; i < events.size(); ++i) {
    const auto& v = events[i].summary().value(0);
    EXPECT_EQ(events[i].step(), next[v.tag()]++) << "records of one thread stay in order";
  }
  EXPECT_EQ(w.records_written(), 1u + kThreads * kPerThread);
}

TEST(Events, HistogramUsesTensorFlowBuckets) {
  std::vector<double> values = {0.0, 1.0, 1.0, -2.0, 1e-13, 5e30};
  tensorboard::HistogramProto h;
  make_histogram(values, h);
  ASSERT_EQ(h.bucket_size(), h.bucket_limit_size());
  double total = 0;
  for (double c : h.bucket()) total += c;
  EXPECT_EQ(total, 6);
  EXPECT_EQ(h.bucket_limit(h.bucket_limit_size() - 1), DBL_MAX);
  // Each non-empty bucket (i) holds values in [limit(i-1), limit(i)).
  for (int i = 0; i < h.bucket_size(); ++i) {
    if (h.bucket(i) == 0) continue;
    double hi = h.bucket_limit(i);
    double lo = i > 0 ? h.bucket_limit(i - 1) : -DBL_MAX;
    int inside = 0;
    for (double v : values) inside += (v >= lo && v < hi);
    EXPECT_EQ(inside, h.bucket(i)) << "bucket " << i << " [" << lo << ", " << hi << ")";
  }
  // 1.0 lands in the bucket whose limit is the first 1e-12 * 1.1^k above 1.
  double limit = 1e-12;
  while (limit <= 1.0) limit *= 1.1;
  bool found = false;
  for (int i = 0; i < h.bucket_size(); ++i)
    found |= (h.bucket_limit(i) == limit && h.bucket(i) == 2);
  EXPECT_TRUE(found);
}

TEST(Events, ReaderDetectsCorruption) {
  TempDir dir;
  std::filesystem::path path;
  {
    EventsWriter w(dir.path(), {.flush_secs = 0});
    w.add_scalar("loss", 1.0, 1);
    path = w.path();
  }
  std::string good = read_bytes(path);
  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;
  };
  std::string bad_len = good, bad_data = good, bad_crc = good;
  bad_len[2] ^= 1;
  bad_data[20] ^= 1;
  bad_crc[good.size() - 1] ^= 1;
  for (const Case& c : {Case{"length", bad_len, "length CRC"}, Case{"data", bad_data, "data CRC"},
                        Case{"data crc", bad_crc, "data CRC"},
                        Case{"truncated", good.substr(0, good.size() - 3), "truncated"},
                        Case{"truncated header", good.substr(0, good.size() - 30), "truncated"}}) {
    write_bytes(path, c.bytes);
    try {
      EventsReader::read_all(path);
      FAIL() << c.name << " not detected";
    } catch (const DataLoss& e) {
      EXPECT_THAT(e.what(), HasSubstr(path.string())) << c.name;
      EXPECT_THAT(e.what(), HasSubstr(c.expect)) << c.name;
    }
  }
}

}  // namespace
}  // namespace longhaul::supervisor
