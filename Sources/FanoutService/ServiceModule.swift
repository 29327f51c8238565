// FanoutService: `fanout serve`. See docs/SERVE.md for the HTTP API and docs/ARCHITECTURE.md for how a request
// becomes a dispatch.
