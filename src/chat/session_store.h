// Chat sessions encrypted at rest (docs/ON-DEVICE.md, "Sessions").
//
// One file per session, named by a keyless BLAKE2b fingerprint of the
// session name (the name itself is never written). Its bytes:
//   "KVSSESS1" | mode (key file / passphrase) | salt | Argon2id costs |
//   XChaCha20-Poly1305(snapshot)
// The header is authenticated as associated data together with the model's
// identity and the session name, so a file moved to another name or model,
// or with a changed header, does not open. The key is either a subkey of the
// key file (0600, created on first use) for this file's salt, or Argon2id of
// a passphrase with that salt.
//
// wipe() is crypto-shredding: every session file and the key file are
// overwritten and deleted. Flash may keep old copies of the blocks; without
// the key they are noise.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "crypto/passphrase.h"

namespace kvs::chat {

struct SessionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SessionKeying {
  std::string key_file;    // used when passphrase is empty; default <dir>/session.key
  std::string passphrase;  // Argon2id when not empty
  crypto::PwhashParams pwhash = crypto::PwhashParams::interactive();
};

class SessionStore {
 public:
  SessionStore(std::string dir, SessionKeying keying, std::string model_identity);
  // Atomic (temporary file, then rename), owner-only (0600).
  void save(const std::string& name, const std::vector<uint8_t>& snapshot);
  // Throws SessionError, naming the session, for a missing, truncated,
  // changed or foreign file and for a wrong key or passphrase.
  std::vector<uint8_t> load(const std::string& name) const;
  // Overwrites and deletes every session file this store names (and
  // leftovers of interrupted saves) and the key file; other files in the
  // folder are left alone. Returns the files removed. Throws SessionError,
  // deleting nothing, when the folder is not a directory or the key file
  // does not look like a session key.
  int wipe();
  std::string path_of(const std::string& name) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, model_;
  SessionKeying k_;
};

// Checks at start that sessions can be saved in `dir`, so a user does not
// type a conversation before learning that /save cannot work: throws
// SessionError when it is not a folder or cannot be written. Returns a note
// ("" if none) for an existing folder that others may list.
std::string check_session_folder(const std::string& dir);

// The default folder: $XDG_DATA_HOME/kvserve/sessions or
// ~/.local/share/kvserve/sessions.
std::string default_session_dir();

}  // namespace kvs::chat
