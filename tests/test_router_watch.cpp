// The router's relay watches (router/relay_watch.h) when the operation they
// watch ends in the same io_context run as the watch's own wake-up: the
// watch's handler is queued already, a cancel does not reach it, and it
// must not re-arm. It once did, and run() never returned: a request hung
// with its worker's answer in hand.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <thread>

#include "router/relay_watch.h"

using namespace kvs::router;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

namespace {

// Runs `ioc` until it has no work or 2 s passed; true when it ran dry.
bool runs_dry(net::io_context& ioc) {
  ioc.run_for(2s);
  return ioc.stopped();
}

}  // namespace

TEST(RouterWatch, APollWhoseTimerFiredWithTheOperationDoesNotRearm) {
  net::io_context ioc;
  net::steady_timer poll(ioc), op(ioc);
  bool ended = false;
  int checks = 0;
  poll_every(poll, 20ms, ended, [&] {
    ++checks;
    return false;
  });
  // The "operation" completes just before the poll's timer, and both have
  // expired before the io_context looks: both handlers are queued together.
  op.expires_after(19ms);
  op.async_wait([&](boost::system::error_code) {
    ended = true;
    poll.cancel();
  });
  std::this_thread::sleep_for(60ms);
  EXPECT_TRUE(runs_dry(ioc)) << "the poll re-armed after the operation ended";
  EXPECT_EQ(checks, 0);
}

TEST(RouterWatch, APollChecksUntilTrue) {
  net::io_context ioc;
  net::steady_timer poll(ioc);
  bool ended = false;
  int checks = 0;
  poll_every(poll, 1ms, ended, [&] { return ++checks == 3; });
  EXPECT_TRUE(runs_dry(ioc));
  EXPECT_EQ(checks, 3);
}

// A client that hangs up while the watch runs (`ended_first`: the watched
// operation ended before, its watch's wake-up already queued, simulated by
// setting ended without a cancel); whether the watch saw the hang-up.
static bool hangup_seen(bool ended_first) {
  net::io_context ioc;
  tcp::acceptor acc(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(ioc), server(ioc);
  client.connect(acc.local_endpoint());
  acc.accept(server);
  bool ended = false, hung_up = false;
  watch_hangup(server, ended, [&] { hung_up = true; });
  ended = ended_first;
  client.close();
  EXPECT_TRUE(runs_dry(ioc)) << "the hang-up watch re-armed";
  return hung_up;
}

TEST(RouterWatch, AHangupIsSeen) { EXPECT_TRUE(hangup_seen(false)); }

// The wake-up queued before the operation ended does nothing.
TEST(RouterWatch, AHangupWatchWokenAfterTheOperationEndedDoesNothing) { EXPECT_FALSE(hangup_seen(true)); }
