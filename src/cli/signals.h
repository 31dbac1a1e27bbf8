// Signal set-up shared by the long-running commands (serve, router).
#pragma once
#include <signal.h>

namespace kvs::cli {

// SIGTERM and SIGINT go to the main thread only (it sigwaits on the set
// returned): blocked before any thread exists so that all inherit the mask.
// SIGPIPE is ignored: a vanished client is a write error, not a dead server.
sigset_t block_signals();

}  // namespace kvs::cli
