// The watches that run beside one relayed socket operation on a
// connection's io_context: a poll on a timer and a wait for the client to
// hang up. Both stop re-arming once the operation's completion sets `ended`.
// Cancelling alone is not enough: a timer that expired, or a socket that
// turned readable, in the same run as the operation's completion has its
// handler queued already; it runs with success after the cancel, and a
// watch that re-armed itself then kept the io_context busy for ever (the
// request hung with its answer in hand).
#pragma once
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>

namespace kvs::router {

// Every `period` until `ended` is set (checked before each run of `check`)
// or `check` returns true.
void poll_every(boost::asio::steady_timer& t, std::chrono::milliseconds period, const bool& ended,
                std::function<bool()> check);

// Until `ended` is set: when `sock` turns readable with end of stream or an
// error, `on_hangup` runs; readable with data (a pipelined request, left in
// the socket) ends the watch.
void watch_hangup(boost::asio::ip::tcp::socket& sock, const bool& ended, std::function<void()> on_hangup);

}  // namespace kvs::router
