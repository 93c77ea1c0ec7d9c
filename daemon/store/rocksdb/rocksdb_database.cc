#include "daemon/store/rocksdb/rocksdb_database.h"

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/options.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <tuple>
#include <utility>

#include "daemon/core/env.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/core/sanitizers.h"
#include "daemon/obs/log.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {

std::string_view ColumnFamilyName(Family f) {
  switch (f) {
    case Family::kMeta:
      return "meta";
    case Family::kDecisions:
      return "decisions";
    case Family::kDecisionKeys:
      return "decision_keys";
    case Family::kDecisionsByTime:
      return "decisions_by_time";
    case Family::kDecisionsByStep:
      return "decisions_by_step";
    case Family::kIdemKeys:
      return "idem_keys";
    case Family::kIdemExpiry:
      return "idem_expiry";
    case Family::kJournal:
      return "journal";
    case Family::kJournalDue:
      return "journal_due";
    case Family::kJournalDead:
      return "journal_dead";
    case Family::kJournalRun:
      return "journal_run";
    case Family::kJournalDoneRef:
      return "journal_done_ref";
    case Family::kJournalExpiry:
      return "journal_expiry";
    case Family::kPlans:
      return "plans";
    case Family::kPlansByState:
      return "plans_by_state";
    case Family::kAudit:
      return "audit";
    case Family::kLeases:
      return "leases";
    case Family::kEscalations:
      return "escalations";
    case Family::kEscalationsOpen:
      return "escalations_open";
    case Family::kEscalationsByTime:
      return "escalations_by_time";
    case Family::kIdemInProgress:
      return "idem_in_progress";
    case Family::kDecisionsExpiry:
      return "decisions_expiry";
    case Family::kOutbox:
      return "outbox";
    case Family::kOutboxDead:
      return "outbox_dead";
    case Family::kTraces:
      return "traces";
    case Family::kTracesByTime:
      return "traces_by_time";
    case Family::kTraceLog:
      return "trace_log";
    case Family::kDecisionTraces:
      return "decision_traces";
    case Family::kLeasesExpiry:
      return "leases_expiry";
    case Family::kEscalationsResolved:
      return "escalations_resolved";
    case Family::kPlansFinished:
      return "plans_finished";
    case Family::kCount:
      break;
  }
  return "";
}

std::string BigEndian8(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

std::string BigEndian8(int64_t v) { return BigEndian8(static_cast<uint64_t>(v < 0 ? 0 : v)); }

std::string InvertedBigEndian8(int64_t v) {
  return BigEndian8(~static_cast<uint64_t>(v < 0 ? 0 : v));
}

uint64_t ReadBigEndian8(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return v;
}

std::string LengthPrefixed(std::string_view s) {
  std::string out = BigEndian8(static_cast<uint64_t>(s.size())).substr(4);
  out.append(s);
  return out;
}

namespace {
rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }
}  // namespace

// RocksDB's info LOG, written with plain stdio. RocksDB's own logger uses
// its file writer, which (in Debian's build, with assertions on) aborts the
// process when it is written to again after a write failed: a full disk
// would turn into a crash at the next line RocksDB logs. Here a line that
// does not fit is lost, nothing more. The previous LOG is kept as
// LOG.old.<micros> (RocksDB keeps keep_log_file_num of those), also when
// the file passes kMaxBytes.
class StdioInfoLog : public rocksdb::Logger {
 public:
  explicit StdioInfoLog(std::string folder) : path_(std::move(folder) + "/LOG") {
    std::lock_guard<std::mutex> lock(mu_);
    Rotate();
  }
  ~StdioInfoLog() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char text[1024];
    std::vsnprintf(text, sizeof(text), format, ap);
    auto now = std::chrono::system_clock::now();
    std::time_t secs = std::chrono::system_clock::to_time_t(now);
    auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
        1'000'000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char stamp[48];
    std::snprintf(stamp, sizeof(stamp), "%04d/%02d/%02d-%02d:%02d:%02d.%06lld ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(micros));
    std::string line = std::string(stamp) + text;
    if (line.empty() || line.back() != '\n') line.push_back('\n');
    std::lock_guard<std::mutex> lock(mu_);
    if (written_ > kMaxBytes) Rotate();
    if (file_ == nullptr) return;
    // Errors ignored: see above.
    written_ += std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }

 private:
  static constexpr size_t kMaxBytes = 16 << 20;

  void Rotate() {
    if (file_ != nullptr) std::fclose(file_);
    auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    std::error_code ec;
    std::filesystem::rename(path_, path_ + ".old." + std::to_string(micros), ec);
    file_ = std::fopen(path_.c_str(), "we");
    written_ = 0;
  }

  std::string path_;
  std::mutex mu_;
  FILE* file_ = nullptr;  // guarded by mu_
  size_t written_ = 0;    // guarded by mu_
};

// RocksDB's background errors (a failed WAL write, flush or compaction)
// reach the database's health flag at once, not only at the next write. Its
// own recovery from a full disk is switched off: it waits until a whole
// memtable's worth (64 MiB) is free and refuses Resume meanwhile (Busy),
// whereas ours resumes as soon as a write fits again.
class RocksDatabase::ErrorListener : public rocksdb::EventListener {
 public:
  explicit ErrorListener(RocksDatabase& db) : db_(db) {}
  void OnBackgroundError(rocksdb::BackgroundErrorReason, rocksdb::Status* error) override {
    if (error != nullptr && !error->ok() && !error->IsShutdownInProgress()) {
      if (error->IsCorruption()) db_.NoteCorruption("background work (flush, compaction)", *error);
      db_.NoteWriteFailure(error->ToString());
    }
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    if (auto_recovery != nullptr) *auto_recovery = false;
  }

 private:
  RocksDatabase& db_;
};

RecordBatch::~RecordBatch() {
  if (!outbox_seqs_.empty()) db_.ReleaseOutboxSeqs(outbox_seqs_);
}

void RecordBatch::AddOutboxEvent(const std::string& type, const std::string& key, int64_t at_ms,
                                 Json data) {
  StatusOr<std::string> data_text = store_internal::EncodeJson(data);
  if (!data_text.ok()) return Fail(data_text.status());
  AddOutboxEventText(type, key, at_ms, *data_text);
}

void RecordBatch::AddOutboxEventText(const std::string& type, const std::string& key, int64_t at_ms,
                                     std::string_view data) {
  const uint64_t seq = db_.TakeOutboxSeq();
  outbox_seqs_.push_back(seq);
  // OutboxEvent::ToJson's members, written as text without building the
  // event (one per complete: the apply cycle's hot path).
  JsonObjectWriter text;
  text.Int("seq", static_cast<int64_t>(seq))
      .Str("event_id", OutboxEvent::IdFor(db_.store_id(), seq))
      .Str("type", type)
      .Str("key", key)
      .Int("at_ms", at_ms)
      .Raw("data", data);
  if (!text.bad().empty()) {
    return Fail(InvalidArgument("outbox event cannot be stored: " + std::string(text.bad()) +
                                " is not valid UTF-8"));
  }
  Put(Family::kOutbox, BigEndian8(seq), text.Take());
}

void RecordBatch::Put(Family f, std::string_view key, std::string_view value) {
  rocksdb::Status s = batch_.Put(db_.handle(f), ToSlice(key), ToSlice(value));
  if (!s.ok() && status_.ok()) status_ = db_.Translate(s, "staging a write");
}

void RecordBatch::PutJson(Family f, std::string_view key, const Json& j) {
  StatusOr<std::string> text = store_internal::EncodeJson(j);
  if (!text.ok()) {
    if (status_.ok()) status_ = text.status();
    return;
  }
  Put(f, key, *text);
}

void RecordBatch::Delete(Family f, std::string_view key) {
  rocksdb::Status s = batch_.Delete(db_.handle(f), ToSlice(key));
  if (!s.ok() && status_.ok()) status_ = db_.Translate(s, "staging a delete");
}

Status RocksDatabase::Translate(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  std::string msg = "store: " + std::string(what) + ": " + s.ToString();
  // A retry can help after an I/O error, a lock held by another process that
  // goes away, or a busy/timed-out write; not after corruption or misuse,
  // which are 500s: a 503 would tell clients and balancers to wait it out.
  if (s.IsCorruption()) NoteCorruption(what, s);
  if (s.IsCorruption() || s.IsNotSupported() || s.IsInvalidArgument()) {
    return Internal(std::move(msg));
  }
  return Unavailable(std::move(msg), true);
}

void RocksDatabase::NoteCorruption(std::string_view what, const rocksdb::Status& s) {
  constexpr int64_t kLogIntervalMs = 60'000;
  const uint64_t seen = corruptions_.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = corruption_logged_ms_.load(std::memory_order_relaxed);
  // One thread per interval wins the line; a damaged block read by every
  // request must not turn the log into a copy of the request rate.
  if (last != INT64_MIN && now - last < kLogIntervalMs) return;
  if (!corruption_logged_ms_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  const uint64_t before = corruptions_logged_.exchange(seen, std::memory_order_relaxed);
  LogEvent(LogLevel::kError, "store.corruption",
           {{"what", ValidUtf8Text(what)},
            {"error", ValidUtf8Text(s.ToString())},
            {"path", ValidUtf8Text(options_.path)},
            {"corruptions", seen},
            {"since_last_line", seen - std::min(before, seen)},
            {"hint",
             "the store has damaged data (a checksum mismatch, a truncated file): requests "
             "that read it answer 500. RocksDB's LOG in the store folder names the file; "
             "restore the folder from a backup"}});
}

StatusOr<std::unique_ptr<RocksDatabase>> RocksDatabase::Open(const StoreOptions& options) {
  if (options.path.empty()) return InvalidArgument("store path is empty", "/store/path");
  // RocksDB creates the folder but not its parents (./var on a fresh clone).
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return Unavailable("cannot create the store folder " + options.path + ": " + ec.message(),
                       false);
  }
  std::unique_ptr<RocksDatabase> self(new RocksDatabase(options));

  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.IncreaseParallelism(2);
  db_options.max_background_jobs = 2;
  db_options.keep_log_file_num = 5;
  // Table files held open: bounded, so the daemon's descriptors stay within
  // the limit it raises at start-up whatever the store's size (RocksDB's
  // default, -1, keeps every file open).
  db_options.max_open_files = 256;
  // Memory is bounded whatever the store's size (a daemon beside an agent
  // must stay small): every memtable of the twenty-odd families together
  // within kMemtableBudget (RocksDB flushes the largest when it is reached),
  // and every table read (data, index and filter blocks) through one shared
  // block cache of kBlockCacheBytes. Without the latter, index and filter
  // blocks live outside any cache and grow with the number of table files.
  constexpr size_t kMemtableBudget = 16 << 20;
  constexpr size_t kBlockCacheBytes = 16 << 20;
  db_options.db_write_buffer_size = kMemtableBudget;
  // The WAL can only be dropped once every family holding writes in it has
  // flushed; rarely written families would otherwise keep it (and the replay
  // after kill -9) growing. Past this size the oldest data is flushed.
  db_options.max_total_wal_size = 32 << 20;
  db_options.writable_file_max_buffer_size = 64 << 10;  // see cf_options.arena_block_size
  // Our writes reach RocksDB already grouped (group_commit.h), one writer at
  // a time: parallel memtable inserts would only add hand-offs between
  // threads, and spinning waiters steal the cores from the request threads.
  db_options.allow_concurrent_memtable_write = false;
  db_options.enable_write_thread_adaptive_yield = false;
  db_options.listeners.push_back(std::make_shared<ErrorListener>(*self));
  db_options.info_log = std::make_shared<StdioInfoLog>(options.path);
  // Journal and idempotency records are point lookups; a bloom filter keeps a
  // miss (first delivery) from touching every level.
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(kBlockCacheBytes, /*num_shard_bits=*/4,
                                           /*strict_capacity_limit=*/false,
                                           /*high_pri_pool_ratio=*/0.5);
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  // Filters sized to what malloc really hands out (less waste per block).
  table.optimize_filters_for_memory = true;
  rocksdb::ColumnFamilyOptions cf_options(db_options);
  cf_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Small memtables: a family that is written rarely still holds one, and
  // the memtable bloom below is sized from it.
  cf_options.write_buffer_size = 4 << 20;
  cf_options.max_write_buffer_number = 2;
  // Memtables grow in blocks of this size, and every file RocksDB writes
  // goes through a buffer of at most the same (writable_file_max_buffer_size,
  // above). Both come and go with each memtable and each file. RocksDB's
  // defaults (an eighth of the memtable, 512 KiB; a 1 MiB file buffer) are
  // above malloc's fixed mmap threshold of 128 KiB (cli/main.cc), so each
  // was a fresh mapping whose every page faulted in: 1.3 faults per claim +
  // complete, a third of the writer's and the flushes' CPU. At 64 KiB they
  // come from the heap, where the next memtable and file reuse what the
  // last one freed (README, "Benchmarks").
  cf_options.arena_block_size = 64 << 10;
  // A compaction holds every key hash of the file it writes until the
  // file's filter is built: at RocksDB's default of 64 MB per file that is
  // several MB per running compaction for the small-record families (trace
  // index, outbox). 16 MB files bound it to a quarter and make index and
  // filter blocks finer-grained in the cache (100k fill: peak RSS 100 -> 94 MB).
  cf_options.target_file_size_base = 16 << 20;
  // Records are JSON and compress well. LZ4 where compaction rewrites often,
  // ZSTD on the last level, where most bytes end up and stay cold. Level 0
  // is not compressed: its files live until the next compaction reads them
  // back, so compressing at flush cost CPU (a fifth of the background work
  // on claim + complete) for bytes kept only seconds.
  cf_options.compression = rocksdb::kLZ4Compression;
  cf_options.compression_per_level = {rocksdb::kNoCompression,  rocksdb::kLZ4Compression,
                                      rocksdb::kLZ4Compression, rocksdb::kLZ4Compression,
                                      rocksdb::kLZ4Compression, rocksdb::kLZ4Compression,
                                      rocksdb::kLZ4Compression};
  cf_options.bottommost_compression = rocksdb::kZSTD;
  // ZSTD's level 1: on the journal's records smaller than its default (3)
  // and faster (a small store's every compaction writes the last level).
  cf_options.bottommost_compression_opts.level = 1;
  cf_options.bottommost_compression_opts.enabled = true;
  // Level 0 is merged into level 1 once it holds 8 files, not RocksDB's 4.
  // Each such compaction rewrites every level-1 file the new ones overlap,
  // and work ids are hashes, so for the journal that is most of level 1: half as many
  // merges rewrite it half as often. On claim + complete after the other
  // rows of bench_work_http, compaction CPU per operation went from 21.9 and
  // 25.4 µs to 12.3 and 11.0 (README, "Benchmarks"). A point lookup checks
  // up to twice as many level-0 files, each first through its bloom filter
  // (pinned in the block cache), which showed on no row.
  cf_options.level0_file_num_compaction_trigger = 8;

  // Every existing family must be opened, including ones this version does
  // not know (written by a newer idem): keep them open and untouched.
  std::vector<std::string> existing;
  rocksdb::Status listed = rocksdb::DB::ListColumnFamilies(db_options, options.path, &existing);
  if (!listed.ok()) existing = {rocksdb::kDefaultColumnFamilyName};  // a new database
  // A claim of new work, a fresh Idempotency-Key and a decide cache miss all
  // look up a key that is absent: a whole-key bloom filter on the memtable
  // answers those without walking its skiplist.
  rocksdb::ColumnFamilyOptions point_lookup_options(cf_options);
  point_lookup_options.memtable_whole_key_filtering = true;
  point_lookup_options.memtable_prefix_bloom_size_ratio = 0.02;
  // The journal is merged by size (universal style), not by level. Work
  // ids are hashes, so every level-0 file spans every key, and a levelled
  // merge into level 1 rewrote all of level 1 each time (ZSTD, level 1
  // being the last level of a small store): 3.7 of 3.9 s of a whole
  // bench_work_http run's compaction CPU. Merging runs of similar size
  // wrote 45% fewer bytes with 45% less CPU there (README, "Benchmarks").
  // A store moves between the styles both ways (tested): universal keeps
  // its sorted runs in levels, from the last one up.
  rocksdb::ColumnFamilyOptions journal_options(point_lookup_options);
  journal_options.compaction_style = rocksdb::kCompactionStyleUniversal;
  // The trace index takes an entry per request: written at the request
  // rate, read rarely, never updated. Compacting it cost more CPU than the
  // requests themselves (a third of the daemon's samples on duplicate
  // claims), so its family is never compacted: flushed table files stay in
  // level 0 until the trace index drops the oldest (rocksdb_trace_index.h;
  // RocksDB's own FIFO style would need every table file held open), and a
  // lookup skips the files whose bloom filter does not hold its trace id.
  rocksdb::ColumnFamilyOptions trace_log_options(cf_options);
  {
    rocksdb::BlockBasedTableOptions trace_table = table;
    trace_table.whole_key_filtering = false;  // keys are only ever looked up by trace id
    // Every file of this family stays in level 0: pinning their index and
    // filter blocks would keep up to the whole budget's worth in memory.
    trace_table.pin_l0_filter_and_index_blocks_in_cache = false;
    trace_log_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(trace_table));
    trace_log_options.prefix_extractor.reset(rocksdb::NewFixedPrefixTransform(kTraceIdBytes));
    // Level-0 files pile up by design; RocksDB does not stall writes on the
    // level-0 file count of a family without auto compactions (tested).
    trace_log_options.disable_auto_compactions = true;
    // Random trace ids make every skiplist insert a deep search; a vector
    // memtable appends, and sorts once at flush (or for a rare lookup).
    trace_log_options.memtable_factory = std::make_shared<rocksdb::VectorRepFactory>();
    trace_log_options.compression_per_level.clear();  // its files stay in level 0
    trace_log_options.compression = rocksdb::kLZ4Compression;
    trace_log_options.bottommost_compression = rocksdb::kDisableCompressionOption;
  }
  // Decision traces are written once and read rarely (by id, export):
  // ZSTD on every level, and small memtables' worth of room is enough.
  rocksdb::ColumnFamilyOptions cold_options(cf_options);
  cold_options.compression_per_level.clear();
  cold_options.compression = rocksdb::kZSTD;
  // Indexes and logs are only ever scanned, never looked up by key: a bloom
  // filter would only take block cache room (at 1M decisions, the outbox's
  // alone is ~4 MB) and CPU at every flush and compaction.
  rocksdb::ColumnFamilyOptions scan_only_options(cf_options);
  {
    rocksdb::BlockBasedTableOptions scan_table = table;
    scan_table.filter_policy.reset();
    scan_only_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(scan_table));
  }
  // Their keys mostly arrive in order (a time, a sequence number, first):
  // each memtable keeps where its last insert went (one hint, the empty
  // prefix) and starts the next search there, not at the skiplist's head.
  scan_only_options.memtable_insert_with_hint_prefix_extractor.reset(
      rocksdb::NewFixedPrefixTransform(0));
  auto options_for = [&](const std::string& name) {
    if (name == ColumnFamilyName(Family::kJournal)) return journal_options;
    for (Family f : {Family::kIdemKeys, Family::kDecisionKeys}) {
      if (name == ColumnFamilyName(f)) return point_lookup_options;
    }
    for (Family f : kScanOnlyFamilies) {
      if (name == ColumnFamilyName(f)) return scan_only_options;
    }
    if (name == ColumnFamilyName(Family::kTraceLog)) return trace_log_options;
    if (name == ColumnFamilyName(Family::kDecisionTraces)) return cold_options;
    return cf_options;
  };
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : existing) descriptors.emplace_back(name, options_for(name));

  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(rocksdb::DBOptions(db_options), options.path, descriptors, &handles, &raw);
  const std::string why = s.ok() ? "" : s.ToString();
  if (s.IsIOError() && (why.find("While lock file:") != std::string::npos ||
                        why.find("lock hold by current process") != std::string::npos)) {
    // RocksDB's own words ("While lock file: …/LOCK: Resource temporarily
    // unavailable") do not say what to do about it.
    return Unavailable("the store at " + options.path +
                           " is in use by another process (a running idem daemon, or idem "
                           "store copy): stop it, or give this one another --data folder",
                       true);
  }
  if (!s.ok()) return self->Translate(s, "opening " + options.path);
  self->db_.reset(raw);

  // Missing families are created in one call: one OPTIONS file rewrite for
  // all of them rather than one (with its fsyncs) per family.
  std::vector<std::string> missing;
  for (int i = 0; i < static_cast<int>(Family::kCount); ++i) {
    std::string name(ColumnFamilyName(static_cast<Family>(i)));
    bool found = false;
    for (const std::string& e : existing) found = found || e == name;
    if (!found) missing.push_back(std::move(name));
  }
  if (!missing.empty()) {
    std::vector<rocksdb::ColumnFamilyDescriptor> to_create;
    for (const std::string& name : missing) to_create.emplace_back(name, options_for(name));
    std::vector<rocksdb::ColumnFamilyHandle*> created;
    s = raw->CreateColumnFamilies(to_create, &created);
    handles.insert(handles.end(), created.begin(), created.end());
    if (!s.ok()) {
      self->other_handles_ = std::move(handles);  // closed by the destructor
      return self->Translate(s, "creating column families in " + options.path);
    }
  }
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    bool known = false;
    for (int i = 0; i < static_cast<int>(Family::kCount) && !known; ++i) {
      if (h->GetName() == ColumnFamilyName(static_cast<Family>(i))) {
        self->handles_[i] = h;
        known = true;
      }
    }
    if (!known) self->other_handles_.push_back(h);
  }
  RocksDatabase* db = self.get();
  self->group_commit_ = std::make_unique<GroupCommit>(
      *raw, std::vector<rocksdb::ColumnFamilyHandle*>(self->handles_.begin(), self->handles_.end()),
      [db](const rocksdb::Status& written, int64_t micros) {
        db->NoteWrite(written);
        if (db->options_.on_write_micros) db->options_.on_write_micros(micros);
      },
      [db](size_t bytes) { return db->AdmitWrite(bytes); });
  // The outbox sequence continues after the last event written, or after
  // the last one retention deleted.
  {
    uint64_t last = 0;
    std::unique_ptr<rocksdb::Iterator> it = self->NewIterator(Family::kOutbox, {});
    it->SeekToLast();
    if (it->Valid()) last = ReadBigEndian8(std::string_view(it->key().data(), it->key().size()));
    RETURN_IF_ERROR(self->IteratorStatus(*it, "reading the outbox"));
    ASSIGN_OR_RETURN(std::optional<std::string> swept, self->Get(Family::kMeta, kOutboxSweptKey));
    if (swept) last = std::max(last, ReadBigEndian8(*swept));
    MutexLock lock(self->outbox_mu_);
    self->outbox_next_ = last + 1;
  }
  // The store's id (its outbox events' event_id prefix), made once. One
  // process at a time opens the folder, so reading then writing is safe.
  {
    ASSIGN_OR_RETURN(std::optional<std::string> id, self->Get(Family::kMeta, kStoreIdKey));
    if (!id || id->empty()) {
      id = NewStoreId();
      RecordBatch batch(*self);
      batch.Put(Family::kMeta, kStoreIdKey, *id);
      RETURN_IF_ERROR(self->Commit(batch, /*durable=*/true));
    }
    self->store_id_ = std::move(*id);
  }
  self->recovery_ = std::thread([db] {
    NameThread("recovery");
    db->RecoveryLoop();
  });
  return self;
}

RocksDatabase::~RocksDatabase() {
  bool flush_on_close = !writes_failing_.load(std::memory_order_acquire);
  if (recovery_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      stopping_ = true;
    }
    health_cv_.notify_all();
    // A Resume() in progress waits for a flush that a still-full disk may
    // never let finish; cancelling background work ends that wait
    // (ShutdownInProgress), so a stop cannot hang on it.
    const bool cancelled = recovering_.load(std::memory_order_acquire) && db_ != nullptr;
    if (cancelled) rocksdb::CancelAllBackgroundWork(db_.get(), /*wait=*/false);
    recovery_.join();  // it writes through group_commit_
    if (cancelled) flush_on_close = false;
  }
  group_commit_.reset();  // its committer thread writes through db_
  if (db_ == nullptr) return;
  // A clean stop leaves nothing in the WAL: the next start replays nothing
  // and opens in a time that does not grow with what was written last.
  std::vector<rocksdb::ColumnFamilyHandle*> to_flush;
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    if (h != nullptr) to_flush.push_back(h);
  }
  rocksdb::FlushOptions flush;
  flush.wait = true;
  // Not while writes fail: the flush would fail too, or wait on the disk.
  if (flush_on_close && !to_flush.empty()) db_->Flush(flush, to_flush).PermitUncheckedError();
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    if (h != nullptr) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  for (rocksdb::ColumnFamilyHandle* h : other_handles_) {
    db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  db_->Close().PermitUncheckedError();
}

StatusOr<std::optional<std::string>> RocksDatabase::Get(Family f, std::string_view key,
                                                        const rocksdb::Snapshot* snapshot) {
  for (Family scan_only : kScanOnlyFamilies) {
    // Its files have no bloom filter: every lookup would read a data block per level.
    if (f == scan_only)
      return Internal("point lookup in scan-only family " + std::string(ColumnFamilyName(f)));
  }
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  std::optional<std::string> value(std::in_place);
  rocksdb::Status s = db_->Get(ro, handle(f), ToSlice(key), &*value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return Translate(s, "reading " + std::string(ColumnFamilyName(f)));
  return value;
}

Status RocksDatabase::Commit(RecordBatch& batch, bool durable) {
  RETURN_IF_ERROR(batch.status_);
  if (batch.empty()) return Status::Ok();
  if (Status fp = Failpoints::Hit("store.write"); !fp.ok()) {
    NoteWriteFailure(fp.message());
    return fp;
  }
  Status written =
      Translate(group_commit_->Commit(batch.batch_, durable && options_.sync), "writing");
  // Written (visible to readers) or failed for good: either way no longer in flight.
  ReleaseOutboxSeqs(batch.outbox_seqs_);
  batch.outbox_seqs_.clear();
  return written;
}

StatusOr<std::shared_ptr<GroupCommit::Ticket>> RocksDatabase::CommitAsync(
    RecordBatch& batch, bool durable, std::function<void()> on_done) {
  RETURN_IF_ERROR(batch.status_);
  if (batch.empty()) return std::shared_ptr<GroupCommit::Ticket>();
  if (Status fp = Failpoints::Hit("store.write"); !fp.ok()) {
    NoteWriteFailure(fp.message());
    return fp;
  }
  if (!batch.outbox_seqs_.empty()) {
    // Given back on the writing thread once the write is over.
    std::vector<uint64_t> seqs = std::move(batch.outbox_seqs_);
    batch.outbox_seqs_.clear();
    on_done = [this, seqs = std::move(seqs), then = std::move(on_done)] {
      ReleaseOutboxSeqs(seqs);
      if (then) then();
    };
  }
  return group_commit_->Submit(batch.batch_, durable && options_.sync, std::move(on_done));
}

uint64_t RocksDatabase::TakeOutboxSeq() {
  MutexLock lock(outbox_mu_);
  uint64_t seq = outbox_next_++;
  outbox_in_flight_.insert(seq);
  return seq;
}

void RocksDatabase::ReleaseOutboxSeqs(const std::vector<uint64_t>& seqs) {
  if (seqs.empty()) return;
  MutexLock lock(outbox_mu_);
  for (uint64_t s : seqs) outbox_in_flight_.erase(s);
}

uint64_t RocksDatabase::OutboxWatermark() {
  MutexLock lock(outbox_mu_);
  if (outbox_in_flight_.empty()) return outbox_next_ - 1;
  return *outbox_in_flight_.begin() - 1;
}

Status RocksDatabase::WriteHealth() const {
  // Below the floor every write will be refused: say so before one is
  // tried, so a balancer sends writes elsewhere at once (one statvfs).
  if (const uint64_t floor = options_.min_free_bytes; floor > 0) {
    if (std::optional<uint64_t> free_bytes = FreeBytes(); free_bytes && *free_bytes < floor) {
      return Unavailable("store: the disk has " + std::to_string(*free_bytes >> 20) +
                         " MiB free, below store.min_free_mb (" + std::to_string(floor >> 20) +
                         "): writes are refused until space returns (reads still work)");
    }
  }
  if (!writes_failing_.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard<std::mutex> lock(health_mu_);
  if (!writes_failing_.load(std::memory_order_relaxed)) return Status::Ok();
  return Unavailable("store: writes are failing (reads still work; retried every second): " +
                     write_error_);
}

void RocksDatabase::NoteWrite(const rocksdb::Status& s) {
  if (s.ok()) {
    // The common case costs one load: nothing to clear.
    if (!writes_failing_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(health_mu_);
    writes_failing_.store(false, std::memory_order_release);
    write_error_.clear();
    return;
  }
  // A batch naming an unknown family is that batch's fault, not the disk's.
  if (s.IsInvalidArgument() || s.IsNotSupported()) return;
  NoteWriteFailure(s.ToString());
}

void RocksDatabase::NoteWriteFailure(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    write_error_ = error;
    writes_failing_.store(true, std::memory_order_release);
  }
  health_cv_.notify_all();
}

namespace {
constexpr uint64_t kRecoveryMarginBytes = 1 << 20;  // 1 MiB beyond the memtables
}  // namespace

void RocksDatabase::RecoveryLoop() {
  constexpr auto kInterval = std::chrono::seconds(1);
  std::unique_lock<std::mutex> lock(health_mu_);
  for (;;) {
    health_cv_.wait(lock, [&] { return stopping_ || writes_failing_.load(); });
    // Not at once: the write that failed has just seen the error, and the
    // disk rarely frees itself within microseconds.
    health_cv_.wait_for(lock, kInterval, [&] { return stopping_; });
    if (stopping_) return;
    if (!writes_failing_.load()) continue;
    recovering_.store(true, std::memory_order_release);
    lock.unlock();
    TryRecover();
    lock.lock();
    recovering_.store(false, std::memory_order_release);
  }
}

std::vector<std::pair<std::string, uint64_t>> RocksDatabase::MemoryUsage() const {
  std::vector<std::pair<std::string, uint64_t>> parts;
  // Summed over the families; the block cache is one, shared by all.
  for (const auto& [name, property, aggregated] :
       {std::tuple<const char*, const char*, bool>{"memtables", "rocksdb.cur-size-all-mem-tables",
                                                   true},
        {"table_readers", "rocksdb.estimate-table-readers-mem", true},
        {"block_cache", "rocksdb.block-cache-usage", false},
        {"block_cache_pinned", "rocksdb.block-cache-pinned-usage", false}}) {
    uint64_t bytes = 0;
    const bool ok = aggregated ? db_->GetAggregatedIntProperty(property, &bytes)
                               : db_->GetIntProperty(property, &bytes);
    if (ok) parts.emplace_back(name, bytes);
  }
  return parts;
}

StatusOr<std::vector<std::pair<std::string, uint64_t>>> RocksDatabase::DiskUsage() {
  std::vector<std::pair<std::string, uint64_t>> parts;
  uint64_t in_tables = 0;
  for (size_t f = 0; f < static_cast<size_t>(Family::kCount); ++f) {
    uint64_t bytes = 0;
    if (!db_->GetIntProperty(handle(static_cast<Family>(f)), "rocksdb.live-sst-files-size",
                             &bytes)) {
      continue;
    }
    parts.emplace_back(ColumnFamilyName(static_cast<Family>(f)), bytes);
    in_tables += bytes;
  }
  // The folder as it is now: a file deleted between the listing and its
  // size (a compaction's input, an old WAL) counts as nothing.
  uint64_t in_wal = 0, in_folder = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(options_.path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (!it->is_regular_file(size_ec)) continue;
    const uint64_t size = it->file_size(size_ec);
    if (size_ec) continue;
    in_folder += size;
    if (it->path().extension() == ".log") in_wal += size;
  }
  if (ec) return Unavailable("reading the store's folder " + options_.path + ": " + ec.message());
  parts.emplace_back("wal", in_wal);
  // Tables flushed or compacted after their property was read may make the
  // sum of the parts exceed the walk's: the rest is then 0.
  parts.emplace_back("other", in_folder > in_tables + in_wal ? in_folder - in_tables - in_wal : 0);
  return parts;
}

void RocksDatabase::TryRecover() {
  // Resume flushes the memtables; on a disk still full that flush fails and
  // RocksDB 7.8's Resume may then wait for a flush it never reschedules,
  // leaving recovery stuck for good (about 1 run in 5 of the disk-full test).
  // So it is called only once the disk has room for what the memtables hold
  // (their flushed files are compressed, so smaller) plus a margin.
  uint64_t in_memtables = 0;
  db_->GetAggregatedIntProperty("rocksdb.cur-size-all-mem-tables", &in_memtables);
  if (std::optional<uint64_t> free_bytes = FreeBytes()) {
    const uint64_t wanted = in_memtables + kRecoveryMarginBytes;
    if (*free_bytes < wanted) {
      NoteWriteFailure("the disk is full: " + std::to_string(*free_bytes) +
                       " bytes free, recovery waits for " + std::to_string(wanted));
      return;
    }
  }
  // After a failed WAL write or flush RocksDB refuses every write until
  // Resume (which flushes and starts a new WAL, so it fails too while the
  // disk is still full). Without such an error Resume is a no-op.
  rocksdb::Status resumed = db_->Resume();
  if (!resumed.ok()) {
    NoteWriteFailure(resumed.ToString());
    return;
  }
  // Resume succeeding does not prove that a write would (the failpoint, or
  // an error RocksDB did not keep): a real, synced write does.
  RecordBatch probe(*this);
  probe.Put(Family::kMeta, "store.write_probe", "");
  (void)Commit(probe, true);  // its outcome reaches NoteWrite
}

std::optional<uint64_t> RocksDatabase::FreeBytes() const {
  struct statvfs fs {};
  if (::statvfs(options_.path.c_str(), &fs) != 0) return std::nullopt;
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

rocksdb::Status RocksDatabase::AdmitWrite(size_t bytes) {
  const uint64_t floor = options_.min_free_bytes;
  if (floor == 0) return rocksdb::Status::OK();
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  MutexLock lock(space_mu_);
  // The WAL takes about what the batch holds; twice that covers its framing
  // and the memtable flush the write may later cause.
  const uint64_t cost = 2 * static_cast<uint64_t>(bytes) + 4096;
  const uint64_t headroom = space_free_ > floor ? space_free_ - floor : 0;
  if (now - space_checked_ms_ >= 10 || space_since_ + cost > headroom / 2) {
    std::optional<uint64_t> free_bytes = FreeBytes();
    if (!free_bytes) return rocksdb::Status::OK();  // cannot tell: let RocksDB find out
    space_free_ = *free_bytes;
    space_checked_ms_ = now;
    space_since_ = 0;
  }
  if (space_free_ < floor + cost) {
    space_checked_ms_ = 0;  // look again next time: space may come back any moment
    return rocksdb::Status::NoSpace("the store's disk has " + std::to_string(space_free_ >> 20) +
                                    " MiB free, below store.min_free_mb (" +
                                    std::to_string(floor >> 20) + ")");
  }
  space_since_ += cost;
  return rocksdb::Status::OK();
}

std::unique_ptr<rocksdb::Iterator> RocksDatabase::NewIterator(Family f,
                                                              const rocksdb::ReadOptions& ro) {
  return std::unique_ptr<rocksdb::Iterator>(db_->NewIterator(ro, handle(f)));
}

Status RocksDatabase::IteratorStatus(const rocksdb::Iterator& it, std::string_view what) {
  return Translate(it.status(), what);
}

StatusOr<std::vector<std::string>> RocksDatabase::ExpiredIndexKeys(Family index, int64_t now_ms,
                                                                   size_t limit,
                                                                   std::string_view what) {
  std::vector<std::string> keys;
  int64_t bound = now_ms == std::numeric_limits<int64_t>::max() ? now_ms : now_ms + 1;
  std::string upper = BigEndian8(bound);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it = NewIterator(index, ro);
  for (it->SeekToFirst(); it->Valid() && keys.size() < limit; it->Next()) {
    keys.emplace_back(it->key().data(), it->key().size());
  }
  RETURN_IF_ERROR(IteratorStatus(*it, "scanning " + std::string(what)));
  return keys;
}

StatusOr<size_t> RocksDatabase::CountKeys(Family f, std::string_view prefix, size_t cap,
                                          std::string_view what) {
  size_t n = 0;
  std::unique_ptr<rocksdb::Iterator> it = NewIterator(f, {});
  for (it->Seek(rocksdb::Slice(prefix.data(), prefix.size()));
       it->Valid() && n < cap &&
       it->key().starts_with(rocksdb::Slice(prefix.data(), prefix.size()));
       it->Next()) {
    ++n;
  }
  RETURN_IF_ERROR(IteratorStatus(*it, "counting " + std::string(what)));
  return n;
}

Status RocksDatabase::IndexOnce(Family source, Family index, std::string_view marker,
                                std::string_view what, const IndexEntryOf& entry_of) {
  ASSIGN_OR_RETURN(std::optional<std::string> indexed, Get(Family::kMeta, std::string(marker)));
  if (indexed) return Status::Ok();
  // Written 1,000 entries at a time while reading: memory stays bounded
  // however many records an older store holds.
  constexpr int kPerWrite = 1'000;
  auto batch = std::make_unique<RecordBatch>(*this);
  int64_t read = 0, staged = 0;
  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<rocksdb::Iterator> it = NewIterator(source, {});
  it->SeekToFirst();
  // An older store's first start takes longer by this (about 4.5 s for 1M
  // plans): say why, before and after. A new store has nothing to read.
  if (it->Valid()) {
    LogEvent(LogLevel::kInfo, "store.indexing",
             {{"index", ColumnFamilyName(index)}, {"records", std::string(what) + "s"}});
  }
  for (; it->Valid(); it->Next()) {
    ++read;
    ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(it->value().ToString(), what));
    ASSIGN_OR_RETURN(std::optional<std::string> entry,
                     entry_of(std::string_view(it->key().data(), it->key().size()), j));
    if (!entry) continue;
    batch->Put(index, *entry, "");
    if (++staged % kPerWrite == 0) {
      RETURN_IF_ERROR(Commit(*batch, /*durable=*/false));
      batch = std::make_unique<RecordBatch>(*this);
    }
  }
  RETURN_IF_ERROR(IteratorStatus(*it, "indexing " + std::string(what) + "s"));
  batch->Put(Family::kMeta, marker, "1");  // after the entries, which it makes durable
  RETURN_IF_ERROR(Commit(*batch, /*durable=*/true));
  if (read > 0) {
    LogEvent(LogLevel::kInfo, "store.indexed",
             {{"index", ColumnFamilyName(index)},
              {"read", read},
              {"indexed", staged},
              {"ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count()}});
  }
  return Status::Ok();
}

size_t RocksDatabase::StripeOf(Family f, std::string_view key) {
  size_t h = std::hash<std::string_view>{}(key) ^ (static_cast<size_t>(f) * 0x9e3779b97f4a7c15ull);
  return h % kStripes;
}

// The stripes held are a set decided at run time, which the thread-safety
// analysis cannot follow: each is released in Flush, after the write.
Status ChunkedSweep::Lock(Mutex& mu) NO_THREAD_SAFETY_ANALYSIS {
  if (std::find(held_.begin(), held_.end(), &mu) != held_.end()) return Status::Ok();
  // A record a sweep looked at and left (renewed meanwhile, held past its
  // window) keeps its stripe until the write too: bound the stripes, not
  // only the records staged.
  if (held_.size() >= kChunk || (!held_.empty() && !mu.TryLock())) {
    RETURN_IF_ERROR(Flush());
  }
  if (held_.empty()) mu.Lock();
  held_.push_back(&mu);
  return Status::Ok();
}

Status ChunkedSweep::Next() {
  if (++records_ < kChunk) return Status::Ok();
  return Flush();
}

Status ChunkedSweep::Flush() NO_THREAD_SAFETY_ANALYSIS {
  Status written = db_.Commit(*batch_, /*durable=*/false);
  for (auto& fn : after_) fn();
  for (Mutex* m : held_) m->Unlock();
  held_.clear();
  after_.clear();
  records_ = 0;
  batch_ = std::make_unique<RecordBatch>(db_);
  return written;
}

ChunkedSweep::~ChunkedSweep() {
  Status ignored = Flush();  // an early return's error is the one its caller reports
  (void)ignored;
}

}  // namespace idem::rocks

// librocksdb is not built with ThreadSanitizer: its memtable publishes
// records through atomics TSan cannot see, so a lock-free Get that reads a
// record another thread just wrote looks like a race. Reports whose stacks
// pass through the library are suppressed; races between our own accesses
// stay reported. Defined here, in the store library, so that every TSan
// binary using the store (store, apply, decide, http tests) gets it.
#if defined(IDEM_UNDER_TSAN)
extern "C" const char* __tsan_default_suppressions() { return "race:librocksdb.so\n"; }
#endif
