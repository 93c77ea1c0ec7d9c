#include "tests/fakes/serve.h"

#include <sys/socket.h>

#include <chrono>
#include <memory>

namespace idem::fakes {

int ServeInBackground(httplib::Server& svr, int port, std::thread& thread) {
  auto listen_fd = std::make_shared<int>(-1);
  svr.set_socket_options([listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    *listen_fd = sock;
  });
  int bound = port == 0 ? svr.bind_to_any_port("127.0.0.1")
                        : (svr.bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound <= 0 || *listen_fd < 0) return -1;
  // listen() on a socket that listens already sets its backlog anew (Linux).
  if (::listen(*listen_fd, SOMAXCONN) != 0) return -1;
  thread = std::thread([&svr] { svr.listen_after_bind(); });
  for (int i = 0; i < 5000 && !svr.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

}  // namespace idem::fakes
