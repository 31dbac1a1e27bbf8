#include "server/tcp_listen.h"

#include <stdexcept>

namespace kvs::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

int listen_on(tcp::acceptor& acceptor, const std::string& host, int port) {
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(host, ec);
  if (ec) throw std::runtime_error("--host '" + host + "' is not an IP address");
  const tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  return acceptor.local_endpoint().port();
}

}  // namespace kvs::server
