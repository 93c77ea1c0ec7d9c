// The release this binary was built from: project(VERSION) in the top
// CMakeLists.txt. `idem --version`, the "started" log line and the
// idem_build_info metric report it.
#pragma once

namespace idem {

inline constexpr char kVersion[] = IDEM_VERSION;

}  // namespace idem
