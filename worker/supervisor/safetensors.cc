#include "longhaul/supervisor/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/base/crc32c.h"
#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"

namespace longhaul::supervisor {
namespace {

// The Rust reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderSize = 100'000'000;
// The header is a JSON object.
constexpr char kJsonObjectStart = '{';

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

bool parse_hex32(const std::string& s, uint32_t& out) {
  if (s.size() != 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v |= static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      v |= static_cast<uint32_t>(c - 'A' + 10);
    } else {
      return false;
    }
  }
  out = v;
  return true;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw DataLoss("safetensors file " + path + " is corrupt or truncated: " + what +
                 "; restore it from a copy or delete it");
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

uint32_t metadata_crc32c(const std::map<std::string, std::string>& metadata) {
  uint32_t crc = 0;
  const char zero = '\0';
  for (const auto& [k, v] : metadata) {
    if (k == kMetadataCrc32cKey) continue;
    crc = crc32c::extend(crc, k.data(), k.size());
    crc = crc32c::extend(crc, &zero, 1);
    crc = crc32c::extend(crc, v.data(), v.size());
    crc = crc32c::extend(crc, &zero, 1);
  }
  return crc;
}

namespace {

// Test-only (documented in worker/distributed/README.md): LONGHAUL_TEST_PAUSE_CHECKPOINT_WRITE=
// <file name> makes the writer of that file (e.g. model.ckpt-30.safetensors) stop for good after
// its first tensor, with the temp file half written, and say so on stderr: a test then kills the
// process at exactly that point (a chief lost in the middle of a checkpoint write). Never set it
// in production: the writer thread blocks until the process is killed.
void pause_here_for_tests(const std::filesystem::path& path) {
  static const char* const target = std::getenv("LONGHAUL_TEST_PAUSE_CHECKPOINT_WRITE");
  if (target == nullptr || *target == '\0' || path.filename() != target) return;
  LH_LOG(WARNING) << "LONGHAUL_TEST_PAUSE_CHECKPOINT_WRITE: paused in the middle of a checkpoint "
                     "write until this process is killed"
                  << kv("file", path.string());
  for (;;) ::pause();
}

}  // namespace

namespace {

// The data is checksummed and written in pieces of this size. 2 MiB rather than 512 KiB: a
// quarter of the write(2) calls and helper wake-ups, and the helper's lead (4 pieces, 8 MiB)
// still fits in a last-level cache; on the development machine's disk the checkpoint went from
// 1.21-1.85x to 1.11-1.25x the time of a paced plain write (bench/README.md).
constexpr size_t kChecksumPiece = 2 << 20;
// From this size on, the checksums are computed on a helper thread while the writing thread
// copies the same bytes into the file (below it, a thread costs more than it saves).
constexpr uint64_t kParallelChecksumBytes = uint64_t{16} << 20;

// The CRC-32C of every tensor, computed on a helper thread started by the constructor, so that a
// checkpoint takes about max(checksums, copy into the file) rather than their sum: the checksum
// was the writer's only work beyond the plain write's, 15-20% of its time (bench/README.md). The
// helper stays at most kChecksumLead pieces ahead of the writing thread (which reports each
// piece it wrote and never waits for the helper before get()), so the piece the writer copies was
// just read by the helper and is still in the shared cache: the state is read from memory about
// once, as in a single-thread pass. The thread only reads the tensors, which the caller keeps
// unchanged until get() or the destructor, both of which join it (the destructor first stops it
// early: a write that failed does not wait for checksums nobody will use).
constexpr int kChecksumLead = 4;

class ChecksumThread {
 public:
  explicit ChecksumThread(std::span<const TensorView> tensors)
      : tensors_(tensors), crcs_(tensors.size(), 0), thread_([this] { run(); }) {}
  ~ChecksumThread() {
    cancelled_.store(true, std::memory_order_relaxed);
    written_.fetch_add(1 << 30, std::memory_order_release);  // wakes a waiting helper
    written_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ChecksumThread(const ChecksumThread&) = delete;
  ChecksumThread& operator=(const ChecksumThread&) = delete;

  // The writing thread wrote one more piece (kChecksumPiece bytes, or a tensor's last piece).
  void wrote_piece() {
    written_.fetch_add(1, std::memory_order_release);
    written_.notify_one();
  }

  // Waits for the thread; one checksum per tensor, in order. Every piece must have been reported.
  const std::vector<uint32_t>& get() {
    thread_.join();
    return crcs_;
  }
  // The thread's CPU time and how many times it slept; valid after get().
  double cpu_seconds() const { return cpu_seconds_; }
  int64_t sleeps() const { return sleeps_; }

 private:
  void run() {
    int piece = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const std::span<const std::byte> bytes = tensors_[i].bytes;
      uint32_t crc = 0;
      for (size_t at = 0; at < bytes.size(); at += kChecksumPiece, ++piece) {
        for (int written = written_.load(std::memory_order_acquire);
             piece >= written + kChecksumLead; written = written_.load(std::memory_order_acquire)) {
          written_.wait(written, std::memory_order_acquire);
        }
        if (cancelled_.load(std::memory_order_relaxed)) return;
        crc = crc32c::extend(crc, bytes.data() + at, std::min(kChecksumPiece, bytes.size() - at));
      }
      crcs_[i] = crc;
    }
    timespec ts{};  // precise, where getrusage's CPU times may be tick-based
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    cpu_seconds_ = double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
    rusage u{};
    ::getrusage(RUSAGE_THREAD, &u);
    sleeps_ = u.ru_nvcsw;
  }

  const std::span<const TensorView> tensors_;
  std::vector<uint32_t> crcs_;  // written by the thread, read after join
  double cpu_seconds_ = 0;      // written by the thread, read after join
  int64_t sleeps_ = 0;          // the same: voluntary context switches (waits for the writer)
  std::atomic<bool> cancelled_{false};
  std::atomic<int> written_{0};  // pieces the writing thread wrote
  std::thread thread_;           // last: started once the fields above exist
};

void check_tensors(const std::filesystem::path& path, std::span<const TensorView> tensors) {
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    const TensorSpec& spec = *t.spec;
    if (spec.name.empty() || spec.name == "__metadata__") {
      throw InvalidArgument("cannot write tensor named \"" + spec.name + "\" to " + path.string() +
                            ": the name is reserved or empty");
    }
    if (!names.insert(spec.name).second) {
      throw InvalidArgument("tensor " + spec.name + " appears twice in checkpoint " +
                            path.string());
    }
    if (t.bytes.size() != spec.nbytes()) {
      throw InvalidArgument("tensor " + spec.name + " has " + std::to_string(t.bytes.size()) +
                            " bytes but its spec " + std::string(dtype_name(spec.dtype)) +
                            shape_string(spec.shape) + " needs " + std::to_string(spec.nbytes()));
    }
  }
}

// The header: its 8-byte little-endian length, then the JSON padded with spaces to a multiple of
// 8. Checksums are fixed-width hex, so the length does not depend on `crcs` (one per tensor).
std::string header_bytes(std::span<const TensorView> tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::vector<uint32_t>& crcs) {
  nlohmann::ordered_json crc_object = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tensors.size(); ++i) crc_object[tensors[i].spec->name] = hex32(crcs[i]);
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  if (!meta.contains("format")) meta["format"] = "pt";
  meta[std::string(kCrc32cMetadataKey)] = crc_object.dump();
  {
    std::map<std::string, std::string> sorted;
    for (auto it = meta.begin(); it != meta.end(); ++it) {
      sorted[it.key()] = it.value().get<std::string>();
    }
    meta[std::string(kMetadataCrc32cKey)] = hex32(metadata_crc32c(sorted));
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const TensorSpec& spec = *t.spec;
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_name(spec.dtype);
    e["shape"] = spec.shape;
    e["data_offsets"] = {offset, offset + t.bytes.size()};
    offset += t.bytes.size();
    header[spec.name] = std::move(e);
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(json.size() >> (8 * i));
  return out + json;
}

}  // namespace

// The header, which holds the checksums, is written first with placeholders of the same length and
// rewritten at the end. A large state is checksummed on a helper thread while this one writes it
// (ChecksumThread); a small one in the same pass, each piece checksummed and then written while
// it is in the CPU cache.
uint64_t write_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::function<void()>& before_rename,
                           SafetensorsWriteTimes* times) {
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  SafetensorsWriteTimes spent;
  const auto started = Clock::now();
  check_tensors(path, tensors);
  std::vector<uint32_t> crcs(tensors.size(), 0);
  auto t = Clock::now();
  const std::string placeholder = header_bytes(tensors, metadata, crcs);
  spent.header_seconds += since(t);

  uint64_t total_bytes = 0;
  for (const auto& t : tensors) total_bytes += t.bytes.size();
  std::optional<ChecksumThread> checksums;
  if (total_bytes >= kParallelChecksumBytes) checksums.emplace(tensors);

  file::AtomicFile out(path);
  out.write(placeholder);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::span<const std::byte> bytes = tensors[i].bytes;
    uint32_t crc = 0;
    for (size_t at = 0; at < bytes.size(); at += kChecksumPiece) {
      const size_t n = std::min(kChecksumPiece, bytes.size() - at);
      if (!checksums) {
        t = Clock::now();
        crc = crc32c::extend(crc, bytes.data() + at, n);
        spent.checksum_seconds += since(t);
      }
      out.write(bytes.data() + at, n);
      if (checksums) checksums->wrote_piece();
    }
    crcs[i] = crc;
    pause_here_for_tests(path);
  }
  if (checksums) {
    t = Clock::now();
    crcs = checksums->get();
    spent.checksum_wait_seconds = since(t);
    spent.checksum_seconds = checksums->cpu_seconds();
    spent.checksum_sleeps = checksums->sleeps();
  }
  t = Clock::now();
  const std::string header = header_bytes(tensors, metadata, crcs);
  spent.header_seconds += since(t);
  if (header.size() != placeholder.size()) {
    throw Internal("the safetensors header of " + path.string() + " changed length from " +
                   std::to_string(placeholder.size()) + " to " + std::to_string(header.size()) +
                   " bytes when its checksums were filled in; this is a bug in longhaul");
  }
  out.overwrite(0, header);
  const uint64_t total = out.bytes_written();
  out.commit(before_rename);
  if (times != nullptr) {
    spent.file = out.times();
    spent.total_seconds = since(started);
    *times = spent;
  }
  return total;
}

uint64_t write_safetensors(const std::filesystem::path& path, const Snapshot& snapshot,
                           const std::function<void()>& before_rename,
                           SafetensorsWriteTimes* times) {
  if (snapshot.specs.size() != snapshot.buffers.size()) {
    throw InvalidArgument("snapshot for " + path.string() + " has " +
                          std::to_string(snapshot.specs.size()) + " specs but " +
                          std::to_string(snapshot.buffers.size()) + " buffers");
  }
  std::vector<TensorView> views;
  views.reserve(snapshot.specs.size());
  for (size_t i = 0; i < snapshot.specs.size(); ++i) {
    views.push_back(TensorView{&snapshot.specs[i], snapshot.buffers[i]});
  }
  auto metadata = snapshot.metadata;
  metadata["global_step"] = std::to_string(snapshot.step);
  return write_safetensors(path, views, metadata, before_rename, times);
}

SafetensorsReader::SafetensorsReader(std::filesystem::path path)
    : SafetensorsReader(std::move(path), Options{}) {}

namespace {

// One tensor's entry of the header: its spec and where its bytes lie (absolute file offsets).
struct TensorExtent {
  TensorSpec spec;
  uint64_t begin = 0, end = 0;
};

// The header's __metadata__: an object of strings.
std::map<std::string, std::string> parse_metadata(const std::string& path,
                                                  const nlohmann::json& v) {
  if (!v.is_object()) corrupt(path, "__metadata__ is not an object");
  std::map<std::string, std::string> metadata;
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) corrupt(path, "__metadata__ value " + m.key() + " is not a string");
    metadata[m.key()] = m.value().get<std::string>();
  }
  return metadata;
}

// One tensor of the header: a known dtype, a shape of unsigned dimensions, and data_offsets
// inside the data section (which starts at `data_start` and holds `data_size` bytes) that span
// exactly the bytes the dtype and shape need.
TensorExtent parse_tensor(const std::string& path, const std::string& name, const nlohmann::json& v,
                          uint64_t data_start, uint64_t data_size) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
      !v.contains("data_offsets")) {
    corrupt(path, "tensor " + name + " lacks dtype, shape or data_offsets");
  }
  TensorExtent e;
  e.spec.name = name;
  if (!v["dtype"].is_string()) corrupt(path, "tensor " + name + " has a non-string dtype");
  try {
    e.spec.dtype = dtype_from_name(v["dtype"].get<std::string>());
  } catch (const InvalidArgument& err) {
    corrupt(path, "tensor " + name + ": " + err.what());
  }
  if (!v["shape"].is_array()) corrupt(path, "tensor " + name + " has a non-array shape");
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) corrupt(path, "tensor " + name + " has a bad dimension");
    e.spec.shape.push_back(d.get<int64_t>());
  }
  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    corrupt(path, "tensor " + name + " has malformed data_offsets");
  }
  const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
  if (b > en || en > data_size) {
    corrupt(path, "tensor " + name + " data_offsets [" + std::to_string(b) + ", " +
                      std::to_string(en) + "] lie outside the " + std::to_string(data_size) +
                      "-byte data section");
  }
  size_t nbytes = 0;
  try {
    nbytes = e.spec.nbytes();
  } catch (const InvalidArgument& err) {
    corrupt(path, err.what());
  }
  if (en - b != nbytes) {
    corrupt(path, "tensor " + name + " spans " + std::to_string(en - b) + " bytes but " +
                      std::string(dtype_name(e.spec.dtype)) + shape_string(e.spec.shape) +
                      " needs " + std::to_string(nbytes));
  }
  e.begin = data_start + b;
  e.end = data_start + en;
  return e;
}

// When the metadata carries its own CRC-32C (metadata_crc32c), it must match.
void check_metadata_checksum(const std::string& path,
                             const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find(std::string(kMetadataCrc32cKey));
  if (it == metadata.end()) return;
  uint32_t want = 0;
  if (!parse_hex32(it->second, want) || want != metadata_crc32c(metadata)) {
    corrupt(path,
            "__metadata__ does not match its CRC-32C (metadata_crc32c): a value such as the "
            "step or the data position was altered");
  }
}

// The tensors' CRC-32Cs from __metadata__.crc32c (a JSON object of 8-hex-digit strings), by
// tensor name; empty when the file has none.
std::map<std::string, uint32_t, std::less<>> tensor_checksums(
    const std::string& path, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, uint32_t, std::less<>> crcs;
  auto it = metadata.find(std::string(kCrc32cMetadataKey));
  if (it == metadata.end()) return crcs;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception&) {
    corrupt(path, "__metadata__.crc32c is not a JSON object");
  }
  if (!j.is_object()) corrupt(path, "__metadata__.crc32c is not a JSON object");
  for (auto c = j.begin(); c != j.end(); ++c) {
    uint32_t v = 0;
    if (!c.value().is_string() || !parse_hex32(c.value().get<std::string>(), v)) {
      corrupt(path, "__metadata__.crc32c has a malformed checksum for " + c.key());
    }
    crcs[c.key()] = v;
  }
  return crcs;
}

}  // namespace

SafetensorsReader::SafetensorsReader(std::filesystem::path path, Options options)
    : path_(path.string()), options_(options) {
  map_file();
  try {
    const uint64_t data_start = parse_header();
    check_tensors_tile_data(data_start);
    check_metadata_checksum(path_, metadata_);
    index_tensors(tensor_checksums(path_, metadata_));
    verified_ = std::make_unique<std::atomic<bool>[]>(entries_.size());
  } catch (...) {
    if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

void SafetensorsReader::map_file() {
  struct stat st {};
  int fd = -1;
  try {
    fd = file::open_regular_file(path_, "checkpoint", st);
  } catch (const InvalidArgument& e) {  // a FIFO or device named like a checkpoint: unusable
    throw DataLoss(e.what());
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw_errno("cannot map checkpoint", path_, e);
    }
    map_ = static_cast<const std::byte*>(m);
  }
  ::close(fd);
}

uint64_t SafetensorsReader::parse_header() {
  if (size_ < 8)
    corrupt(path_,
            "file has " + std::to_string(size_) + " bytes, less than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(map_[i]);
  if (n > kMaxHeaderSize) corrupt(path_, "header length " + std::to_string(n) + " is implausible");
  if (8 + n > size_) {
    corrupt(path_, "header length " + std::to_string(n) + " runs past the end of the " +
                       std::to_string(size_) + "-byte file");
  }
  const char* hp = reinterpret_cast<const char*>(map_ + 8);
  if (n == 0 || hp[0] != kJsonObjectStart)
    corrupt(path_, "header does not start with a JSON object");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hp, hp + n);
  } catch (const nlohmann::json::exception& e) {
    corrupt(path_, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) corrupt(path_, "header is not a JSON object");

  const uint64_t data_start = 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      metadata_ = parse_metadata(path_, it.value());
      continue;
    }
    TensorExtent t = parse_tensor(path_, it.key(), it.value(), data_start, size_ - data_start);
    Entry e;
    e.spec = std::move(t.spec);
    e.begin = t.begin;
    e.end = t.end;
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  return data_start;
}

void SafetensorsReader::check_tensors_tile_data(uint64_t data_start) const {
  uint64_t expect = data_start;
  for (const auto& e : entries_) {
    if (e.begin != expect) {
      corrupt(path_, e.begin > expect ? "gap of " + std::to_string(e.begin - expect) +
                                            " bytes before tensor " + e.spec.name
                                      : "tensor " + e.spec.name + " overlaps the previous tensor");
    }
    expect = e.end;
  }
  if (expect != size_) {
    corrupt(path_, std::to_string(size_ - expect) +
                       " bytes after the last tensor are not covered by the header");
  }
}

void SafetensorsReader::index_tensors(const std::map<std::string, uint32_t, std::less<>>& crcs) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    auto& e = entries_[i];
    if (!index_.emplace(e.spec.name, i).second)
      corrupt(path_, "tensor " + e.spec.name + " listed twice");
    if (auto c = crcs.find(e.spec.name); c != crcs.end()) {
      e.has_crc = true;
      e.crc = c->second;
    } else if (options_.require_checksums) {
      corrupt(path_, "tensor " + e.spec.name + " has no CRC-32C in __metadata__.crc32c");
    }
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), size_);
}

bool SafetensorsReader::contains(std::string_view name) const { return index_.contains(name); }

std::vector<std::string> SafetensorsReader::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& e : entries_) names.push_back(e.spec.name);
  return names;
}

std::vector<TensorSpec> SafetensorsReader::specs() const {
  std::vector<TensorSpec> specs;
  specs.reserve(entries_.size());
  for (const auto& e : entries_) specs.push_back(e.spec);
  return specs;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    throw NotFound("tensor " + std::string(name) + " is not in checkpoint " + path_);
  }
  return entries_[it->second];
}

const TensorSpec& SafetensorsReader::spec(std::string_view name) const { return entry(name).spec; }

void SafetensorsReader::verify(size_t i) const {
  const Entry& e = entries_[i];
  if (!e.has_crc || verified_[i].load(std::memory_order_acquire)) return;
  uint32_t actual = crc32c::value(map_ + e.begin, e.end - e.begin);
  if (actual != e.crc) {
    corrupt(path_, "tensor " + e.spec.name + " fails its CRC-32C check (stored " + hex32(e.crc) +
                       ", computed " + hex32(actual) + ")");
  }
  verified_[i].store(true, std::memory_order_release);
}

std::span<const std::byte> SafetensorsReader::data(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    throw NotFound("tensor " + std::string(name) + " is not in checkpoint " + path_);
  }
  verify(it->second);
  const Entry& e = entries_[it->second];
  return {map_ + e.begin, static_cast<size_t>(e.end - e.begin)};
}

void SafetensorsReader::verify_all() const {
  for (size_t i = 0; i < entries_.size(); ++i) verify(i);
}

int64_t SafetensorsReader::global_step() const {
  auto it = metadata_.find("global_step");
  if (it == metadata_.end()) return -1;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    corrupt(path_, "__metadata__.global_step \"" + it->second + "\" is not an integer");
  }
}

void check_compatible(const std::vector<TensorSpec>& expected, const TensorSource& source) {
  auto fail = [&](const std::string& what) {
    throw FailedPrecondition("checkpoint " + source.path() + " does not match the model: " + what +
                             "; use a logdir written by the same model configuration, or start "
                             "a fresh logdir");
  };
  for (const auto& want : expected) {
    if (!source.contains(want.name))
      fail("tensor " + want.name + " is missing from the checkpoint");
    const TensorSpec& have = source.spec(want.name);
    if (have.dtype != want.dtype) {
      fail("tensor " + want.name + " has dtype " + std::string(dtype_name(have.dtype)) +
           " in the checkpoint but the model expects " + std::string(dtype_name(want.dtype)));
    }
    if (have.shape != want.shape) {
      fail("tensor " + want.name + " has shape " + shape_string(have.shape) +
           " in the checkpoint but the model expects " + shape_string(want.shape));
    }
  }
}

}  // namespace longhaul::supervisor
