// What `import Fanout` brings with it: the APNs model (push types, headers, payloads, responses) and the
// workspace rate-limit policies that `FanoutEngineConfiguration` takes, and the token registry
// (`RegistryStore`, `SQLiteRegistryStore`) that jobs address activities, users and devices through. A gateway imports `Fanout` alone.
@_exported public import FanoutCore
@_exported public import FanoutPolicy
@_exported public import FanoutRegistry
