// idem_fake_effector: the fake effector server (fake_effector.h) as its own
// process, for tests that kill the daemon and must keep the target's count.
//
//   idem_fake_effector [--port N] [--threads N]
//
// Prints "port <N>" on stdout once it listens, then serves until SIGTERM or
// SIGINT. Faults are set over HTTP (POST /_faults).
//
// This file is compiled into the idem_fakes library too (the folder is
// globbed); main exists only where IDEM_FAKE_EFFECTOR_MAIN is defined.
#ifdef IDEM_FAKE_EFFECTOR_MAIN

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/fakes/fake_effector.h"

int main(int argc, char** argv) {
  int port = 0;
  int threads = 64;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--port" && i + 1 < argc) {
      port = std::atoi(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: idem_fake_effector [--port N] [--threads N]\n");
      return 2;
    }
  }
  // Block the stop signals before any thread starts, so that every thread
  // inherits the mask and sigwait below is the one place they arrive.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = idem::fakes::FakeEffectorServer::Start(port, threads);
  if (!server) {
    std::fprintf(stderr, "idem_fake_effector: cannot bind 127.0.0.1:%d\n", port);
    return 1;
  }
  std::printf("port %d\n", server->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  return 0;
}

#endif  // IDEM_FAKE_EFFECTOR_MAIN
