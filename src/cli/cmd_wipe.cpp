// `kvserve wipe`: crypto-shreds the saved chat sessions without starting a
// chat (what /logout does): every session file and the key file are
// overwritten and deleted.
#include <cstdio>

#include "chat/session_store.h"
#include "cli/commands.h"
#include "cli/on_device.h"

namespace kvs::cli {

void add_wipe(CLI::App& app, Runner& run) {
  auto a = std::make_shared<SessionArgs>();
  CLI::App* c = app.add_subcommand("wipe", "Delete every saved chat session and its key (crypto-shredding)");
  c->add_option("--session-dir", a->dir, "Folder of encrypted chat sessions (default: ~/.local/share/kvserve/sessions)");
  c->add_option("--key-file", a->key_file, "Session key file (default: SESSION_DIR/session.key)");
  c->callback([a, &run] {
    run = [a] {
      chat::SessionKeying k;
      k.key_file = a->key_file;
      chat::SessionStore store(a->folder(), k, "");
      const int n = store.wipe();
      std::printf("kvserve: wiped %d files in %s\n", n, store.dir().c_str());
      return 0;
    };
  });
}

}  // namespace kvs::cli
