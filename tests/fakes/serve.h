// Starting a fake upstream server: one place for what every fake needs.
#pragma once

#include <httplib.h>

#include <thread>

namespace idem::fakes {

// Binds `svr` to 127.0.0.1:`port` (0: a free port the kernel picks), gives
// its listening socket a deep accept queue, and runs the accept loop on
// `thread`. Returns once the loop runs, so Server::stop() works from then on
// (it is a no-op before). Returns the port, or -1 if binding failed.
//
// The accept queue: Debian's libcpp-httplib listens with a backlog of 5. A
// test whose 16 threads connect at once overflowed it on every run
// (ListenOverflows in /proc/net/netstat), and a dropped SYN is retried only
// after 1 s; two drops in a row outlast a 2 s effector timeout, so a test
// failed now and then with one call "timed out" that never reached the fake.
int ServeInBackground(httplib::Server& svr, int port, std::thread& thread);

}  // namespace idem::fakes
