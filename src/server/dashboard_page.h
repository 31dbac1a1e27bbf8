// The dashboard page (GET /dashboard): one self-contained HTML document with
// its CSS and JS inline, no external fetch, served by `kvserve serve` and
// `kvserve router`. It holds no data: it reads GET /dashboard/events (SSE,
// with the admin key from the URL fragment #key=... or typed into the page)
// and redraws on every snapshot. After the first snapshot <body> carries
// data-snapshots (count) and the counts sit in elements with stable ids, so
// a headless browser test can read them from the DOM.
#pragma once
#include <string>

namespace kvs::server {

const std::string& dashboard_html();

}  // namespace kvs::server
