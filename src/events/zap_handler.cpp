#include "events/zap_handler.h"

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string_view>
#include <zmq_addon.hpp>

namespace kvs::events {

namespace {

// Logged refused keys are remembered so that a client retrying does not
// flood the log; past this many, new ones are counted only.
constexpr size_t kMaxLogged = 64;

}  // namespace

ZapHandler::ZapHandler(zmq::context_t& ctx, const std::vector<std::string>& z85_keys)
    : sock_(ctx, zmq::socket_type::rep) {
  for (const std::string& k : z85_keys) {
    std::string raw(32, '\0');
    if (k.size() != 40 || !zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), k.c_str()))
      throw std::runtime_error("client-key '" + k + "' is not a Z85 CURVE key");
    allowed_.insert(raw);
  }
  sock_.set(zmq::sockopt::linger, 0);
  try {
    sock_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(std::string("cannot bind the ZAP handler: ") + e.what());
  }
}

bool ZapHandler::answer() {
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(sock_, std::back_inserter(req), zmq::recv_flags::dontwait)) return true;
  // [version, request id, domain, address, routing id, mechanism, credentials...]
  const bool curve = req.size() >= 7 && req[5].to_string_view() == "CURVE" && req[6].size() == 32;
  const bool ok = curve && allowed_.count(req[6].to_string()) > 0;
  if (!ok) {
    ++refused_;
    const std::string key = curve ? req[6].to_string() : std::string();
    if (logged_.size() < kMaxLogged && logged_.insert(key).second) {
      char z85[41] = "";
      if (curve) zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key.data()), 32);
      std::fprintf(stderr, "kvserve: kv-events: refused a subscriber: %s%.8s%s\n",
                   curve ? "its key is not a client-key (" : "not a CURVE handshake", z85, curve ? "...)" : "");
    }
  }
  const std::string_view status = ok ? "200" : "400";
  const std::string_view text = ok ? "OK" : "not a listed client-key";
  const std::string_view id = req.size() > 1 ? req[1].to_string_view() : std::string_view();
  std::array<zmq::const_buffer, 6> reply = {zmq::str_buffer("1.0"), zmq::buffer(id),   zmq::buffer(status),
                                            zmq::buffer(text),       zmq::str_buffer(""), zmq::str_buffer("")};
  zmq::send_multipart(sock_, reply, zmq::send_flags::dontwait);
  return ok;
}

}  // namespace kvs::events
