// Encrypted chat sessions (src/chat/session_store.h, ChatSession snapshot):
// a resumed chat continues exactly where it stopped without recomputing its
// KV; the files hold no plaintext text or token ids; tampered, truncated,
// foreign files and wrong keys or passphrases give a clear error; wipe
// (and `kvserve wipe`) leaves nothing readable behind.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "chat/chat_session.h"
#include "chat/session_store.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvs;
namespace fs = std::filesystem;

namespace {

#define SKIP_WITHOUT_SHARED() \
  if (!test::shared_available()) GTEST_SKIP() << "../shared not present"

struct Stories {
  std::shared_ptr<const Model> model = Model::load(test::shared("models/stories260K/stories260K.gguf"));
  std::unique_ptr<Tokenizer> tok = Tokenizer::create(model->vocab());
  Engine engine{model, EngineOptions{1}};
  chat::ChatOptions opts() const {
    chat::ChatOptions o;
    o.hard_cap = 512;
    o.max_tokens = 24;
    o.sampling.temperature = 0;
    return o;
  }
};

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(test::temp_dir()) / name;
  fs::remove_all(d);
  return d.string();
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

void put_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

bool contains(const std::vector<uint8_t>& hay, const std::vector<uint8_t>& needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

std::vector<uint8_t> as_bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const chat::SessionError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatStore, ResumedChatContinuesExactlyWithoutRecompute) {
  SKIP_WITHOUT_SHARED();
  Stories s;
  chat::ChatSession a(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());
  a.reply("Once upon a time there was a cat.");
  a.reply("What did the cat do?");
  chat::SessionStore store(fresh_dir("resume"), {}, s.model->identity());
  store.save("evening", a.snapshot());
  EXPECT_EQ(fs::status(store.dir() + "/session.key").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);

  chat::ChatSession b(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());
  b.restore(store.load("evening"));
  EXPECT_EQ(b.stats().n_past, a.stats().n_past);
  EXPECT_EQ(b.stats().turns_kept, 2);
  const chat::ReplyResult ra = a.reply("And then?"), rb = b.reply("And then?");
  EXPECT_FALSE(rb.rebuilt);  // only the new turn was prefilled
  EXPECT_EQ(rb.prompt_tokens, ra.prompt_tokens);
  EXPECT_EQ(rb.text, ra.text);
}

// A quantized KV carries its full-precision residual (the open token group):
// restored with it, the resumed chat still matches token for token.
TEST(ChatStore, QuantizedKvResumesWithItsResidual) {
  SKIP_WITHOUT_SHARED();
  Stories s;
  chat::ChatOptions o = s.opts();
  o.cache.type = KvType::Int8;
  chat::ChatSession a(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), o);
  a.reply("Once upon a time there was a dog.");
  ASSERT_NE(a.stats().n_past % 16, 0) << "the open group should be non-empty for this test";
  chat::SessionStore store(fresh_dir("int8"), {}, s.model->identity());
  store.save("q", a.snapshot());
  chat::ChatSession b(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());  // f32 until restored
  b.restore(store.load("q"));
  EXPECT_NE(b.stats().kv_desc.find("int8"), std::string::npos) << b.stats().kv_desc;
  EXPECT_EQ(b.reply("What next?").text, a.reply("What next?").text);
}

TEST(ChatStore, FilesHoldNoPlaintextTextOrTokenIds) {
  SKIP_WITHOUT_SHARED();
  Stories s;
  chat::ChatSession a(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());
  const std::string secret = "The treasure is buried under the old oak tree.";
  const chat::ReplyResult r = a.reply(secret);
  chat::SessionStore store(fresh_dir("plain"), {}, s.model->identity());
  store.save("diary", a.snapshot());
  const std::string path = store.path_of("diary");
  EXPECT_EQ(fs::path(path).filename().string().find("diary"), std::string::npos);
  const std::vector<uint8_t> file = bytes_of(path);
  EXPECT_FALSE(contains(file, as_bytes("treasure")));
  EXPECT_FALSE(contains(file, as_bytes("oak tree")));
  if (r.text.size() > 8) {
    EXPECT_FALSE(contains(file, as_bytes(r.text.substr(0, 8))));
  }
  // Three consecutive token ids of the message, as int32 or as int16 values.
  const std::vector<int> ids = s.tok->encode(secret, false);
  for (size_t i = 0; i + 3 <= ids.size(); ++i) {
    std::vector<uint8_t> w32, w16;
    for (size_t k = i; k < i + 3; ++k)
      for (int b = 0; b < 4; ++b) {
        w32.push_back(uint8_t(uint32_t(ids[k]) >> (8 * b)));
        if (b < 2) w16.push_back(uint8_t(uint32_t(ids[k]) >> (8 * b)));
      }
    EXPECT_FALSE(contains(file, w32)) << "token ids at " << i;
    EXPECT_FALSE(contains(file, w16)) << "token ids at " << i;
  }
}

TEST(ChatStore, TamperedTruncatedForeignAndWrongKeysGiveClearErrors) {
  SKIP_WITHOUT_SHARED();
  Stories s;
  chat::ChatSession a(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());
  a.reply("Hello");
  const std::string dir = fresh_dir("tamper");
  chat::SessionStore store(dir, {}, s.model->identity());
  store.save("x", a.snapshot());
  const std::string path = store.path_of("x");
  const std::vector<uint8_t> good = bytes_of(path);

  std::vector<uint8_t> bad = good;
  bad[bad.size() / 2] ^= 0x01;
  put_bytes(path, bad);
  EXPECT_NE(error_of([&] { store.load("x"); }).find("cannot decrypt"), std::string::npos);
  bad = good;
  bad[20] ^= 0x80;  // the salt, authenticated as associated data
  put_bytes(path, bad);
  EXPECT_NE(error_of([&] { store.load("x"); }).find("cannot decrypt"), std::string::npos);
  bad = good;
  bad[8] = 7;  // the mode byte
  put_bytes(path, bad);
  EXPECT_NE(error_of([&] { store.load("x"); }).find("damaged header"), std::string::npos);
  put_bytes(path, std::vector<uint8_t>(good.begin(), good.begin() + long(good.size() - 5)));
  EXPECT_NE(error_of([&] { store.load("x"); }).find("cannot decrypt"), std::string::npos);
  put_bytes(path, std::vector<uint8_t>(good.begin(), good.begin() + 30));
  EXPECT_NE(error_of([&] { store.load("x"); }).find("truncated"), std::string::npos);
  put_bytes(path, as_bytes(std::string(200, 'z')));
  EXPECT_NE(error_of([&] { store.load("x"); }).find("not a kvserve session"), std::string::npos);
  put_bytes(path, good);
  EXPECT_NO_THROW(store.load("x"));
  // Another model, or the file copied under another name, does not open.
  chat::SessionStore other_model(dir, {}, "another model");
  EXPECT_NE(error_of([&] { other_model.load("x"); }).find("cannot decrypt"), std::string::npos);
  fs::copy_file(path, store.path_of("y"));
  EXPECT_NE(error_of([&] { store.load("y"); }).find("cannot decrypt"), std::string::npos);
  EXPECT_NE(error_of([&] { store.load("nope"); }).find("no saved session 'nope'"), std::string::npos);
  // A new key file (the old one shredded) cannot open the old session.
  chat::SessionStore fresh(fresh_dir("tamper2"), {}, s.model->identity());
  fresh.save("other", a.snapshot());  // creates a new key there
  fs::copy_file(path, fresh.path_of("x"));
  EXPECT_NE(error_of([&] { fresh.load("x"); }).find("cannot decrypt"), std::string::npos);
}

TEST(ChatStore, PassphraseSessionsNeedTheRightPassphrase) {
  SKIP_WITHOUT_SHARED();
  Stories s;
  chat::ChatSession a(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());
  a.reply("Hello");
  const std::string dir = fresh_dir("pass");
  chat::SessionKeying k;
  k.passphrase = "correct horse battery staple";
  k.pwhash = crypto::PwhashParams::minimum();
  chat::SessionStore store(dir, k, s.model->identity());
  store.save("p", a.snapshot());
  EXPECT_FALSE(fs::exists(dir + "/session.key"));  // no key file in passphrase mode
  EXPECT_NO_THROW(store.load("p"));
  chat::SessionKeying wrong = k;
  wrong.passphrase = "correct horse battery stapler";
  EXPECT_NE(error_of([&] { chat::SessionStore(dir, wrong, s.model->identity()).load("p"); }).find("cannot decrypt"),
            std::string::npos);
  EXPECT_NE(error_of([&] { chat::SessionStore(dir, {}, s.model->identity()).load("p"); }).find("passphrase"),
            std::string::npos);
}

TEST(ChatStore, WipeAndTheCliLeaveNothingReadable) {
  SKIP_WITHOUT_SHARED();
  Stories s;
  chat::ChatSession a(s.engine, *s.tok, server::ChatTemplate::fixed(server::ChatFamily::Plain), s.opts());
  a.reply("Hello");
  const std::string dir = fresh_dir("wipe");
  chat::SessionStore store(dir, {}, s.model->identity());
  store.save("a", a.snapshot());
  store.save("b", a.snapshot());
  std::ofstream(dir + "/notes.txt") << "not a session\n";
  std::ofstream(dir + "/backup.kvs") << "not ours either\n";
  EXPECT_EQ(store.wipe(), 3);  // two sessions and the key
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));  // other files stay, and so does the folder
  EXPECT_TRUE(fs::exists(dir + "/backup.kvs"));
  EXPECT_FALSE(fs::exists(dir + "/session.key"));
  fs::remove(dir + "/notes.txt");
  fs::remove(dir + "/backup.kvs");
  EXPECT_NE(error_of([&] { store.load("a"); }).find("no saved session"), std::string::npos);

  store.save("c", a.snapshot());
  std::string out, err;
  ASSERT_EQ(test::run_kvserve({"wipe", "--session-dir", dir}, &out, &err), 0) << err;
  EXPECT_NE(out.find("wiped 2 files"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace

// Audit 9 M6: without HOME the sessions' default folder is the account's
// home, never the folder the process was started from.
TEST(ChatStore, DefaultFolderWithoutHomeIsTheAccountsHome) {
  const char* saved = std::getenv("HOME");
  const std::string keep = saved ? saved : "";
  const char* xdg = std::getenv("XDG_DATA_HOME");
  const std::string keep_xdg = xdg ? xdg : "";
  ::unsetenv("HOME");
  ::unsetenv("XDG_DATA_HOME");
  const std::string dir = kvs::chat::default_session_dir();
  if (!keep.empty()) ::setenv("HOME", keep.c_str(), 1);
  if (!keep_xdg.empty()) ::setenv("XDG_DATA_HOME", keep_xdg.c_str(), 1);
  EXPECT_EQ(dir.front(), '/') << dir;
  EXPECT_NE(dir.rfind("./", 0), 0u) << dir;
}
