// Opening a listening TCP socket the same way for `kvserve serve` and
// `kvserve router`.
#pragma once
#include <utility>  // std::exchange, used by Boost.Asio 1.74 headers under C++20
#include <boost/asio/ip/tcp.hpp>
#include <string>

namespace kvs::server {

// Opens `acceptor` on host:port (an IP address; port 0: any free port) with
// SO_REUSEADDR and listens. Throws std::runtime_error naming what failed;
// returns the bound port.
int listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, int port);

}  // namespace kvs::server
