// LLVM's C API parses command-line options with its errors sent to a null stream, so an
// unknown option in TENSORTUNE_LLVM_ARGS would vanish without a word. This calls the same
// parser with an error stream of our own and reports whether it accepted every argument.
#include <cstring>
#include <string>

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

// Parses `argv[0..argc)` (argv[0] is the program name). Returns 1 when every option was
// accepted; otherwise 0, with LLVM's message (NUL-terminated, cut to fit) in `err`.
extern "C" int tensortune_parse_llvm_options(int argc, const char *const *argv, char *err,
                                             size_t err_len) {
  std::string message;
  llvm::raw_string_ostream stream(message);
  bool ok = llvm::cl::ParseCommandLineOptions(argc, argv, "", &stream);
  stream.flush();
  if (err != nullptr && err_len > 0) {
    size_t n = message.size() < err_len - 1 ? message.size() : err_len - 1;
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return ok ? 1 : 0;
}
