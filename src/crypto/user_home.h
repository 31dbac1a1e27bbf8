// The user's home folder, for the default places of keys and encrypted
// sessions. A service started without HOME (systemd units often have none)
// must not put its keys in whatever folder it was started from: a new key
// there loses every entry sealed with the old one.
#pragma once
#include <string>

namespace kvs::crypto {

// $HOME, else the account's home from the password database. Throws
// std::runtime_error naming `what_to_pass` when neither gives a folder.
std::string user_home(const std::string& what_to_pass);

}  // namespace kvs::crypto
