// What `import Fanout` brings with it: the APNs model (push types, headers, payloads, responses) and the
// workspace rate-limit policies that `FanoutEngineConfiguration` takes. A gateway imports `Fanout` alone.
@_exported public import FanoutCore
@_exported public import FanoutPolicy
