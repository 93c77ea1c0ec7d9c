// WithDecisionFallback: decisions stay readable while a shared database is
// unreachable.
//
// Wraps a Store (the postgres engine) so that its DecisionStore remembers
// the last `capacity` decisions it read or wrote (least recently used
// evicted). While the database answers, every call goes to it and nothing
// changes. When a read (GetByKey, Get) fails with Unavailable, a remembered
// decision is answered instead: GetByKey only if it has not expired by
// `now_ms`. Writes, lists and sweeps are never answered from memory: they
// fail as the database does (503). A remembered decision may have been
// replaced (cache=refresh) by another daemon meanwhile; during an outage
// the last one this daemon saw is served.
//
// Thread-safety: as store.h; the memory is under one mutex.
#pragma once

#include <cstddef>
#include <memory>

#include "daemon/store/store.h"

namespace idem {

std::unique_ptr<Store> WithDecisionFallback(std::unique_ptr<Store> inner, size_t capacity);

}  // namespace idem
