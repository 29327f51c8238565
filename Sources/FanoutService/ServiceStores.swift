import FanoutFleet
import FanoutRedis
import FanoutRedisRegistry
import FanoutRegistry

/// Where `fanout serve` keeps its state. The dispatch queue is always the SQLite file (`db`). The registry is that
/// file too, or, with `redis`, Redis: shared by every instance given the same URL, so a token registered through one
/// is sent to by an update through another.
struct ServiceStores: Sendable {
    /// The registry API requests read and write.
    let registry: any RegistryStore
    /// A second store object on the same data for the engines: their paging through millions of tokens never holds
    /// up an API request's read (a second SQLite connection pair, or a second Redis connection).
    let engineRegistry: any RegistryStore
    let dispatches: DispatchStore
    /// The API side's Redis client when the registry is on Redis: also used for the shared content timestamps and
    /// provider tokens.
    let redis: RedisClient?
    /// With the registry on Redis: the activities' content timestamps, shared by every instance.
    let contentTimestamps: SharedContentTimestamps?
    private let closeAll: @Sendable () async -> Void

    /// Opens the stores; for Redis, connects twice and checks each answers PING, so a wrong URL or a server that is
    /// down is an error at start (the CLI's exit status 2), not a hang at the first request.
    static func open(_ configuration: ServiceConfiguration) async throws(ServiceStartError) -> ServiceStores {
        let dispatches: DispatchStore
        do {
            dispatches = try DispatchStore(path: configuration.database)
        } catch {
            throw ServiceStartError("cannot open the database \(configuration.database): \(error)")
        }
        guard let url = configuration.redis else {
            do {
                let registry = try SQLiteRegistryStore(path: configuration.database)
                let engineRegistry = try SQLiteRegistryStore(path: configuration.database)
                return ServiceStores(
                    registry: registry, engineRegistry: engineRegistry, dispatches: dispatches, redis: nil,
                    contentTimestamps: nil
                ) {
                    registry.close()
                    engineRegistry.close()
                    dispatches.close()
                }
            } catch {
                dispatches.close()
                throw ServiceStartError("cannot open the database \(configuration.database): \(error)")
            }
        }
        let apiClient: RedisClient
        let engineClient: RedisClient
        do {
            apiClient = try await FleetConnection.connect(url)
        } catch {
            dispatches.close()
            throw ServiceStartError("\(error)")
        }
        do {
            engineClient = try await FleetConnection.connect(url)
        } catch {
            await apiClient.shutdown()
            dispatches.close()
            throw ServiceStartError("\(error)")
        }
        let registry = RedisRegistryStore(client: apiClient)
        let engineRegistry = RedisRegistryStore(client: engineClient)
        return ServiceStores(
            registry: registry, engineRegistry: engineRegistry, dispatches: dispatches, redis: apiClient,
            contentTimestamps: SharedContentTimestamps(client: apiClient, registry: registry)
        ) {
            registry.close()
            engineRegistry.close()
            await apiClient.shutdown()
            await engineClient.shutdown()
            dispatches.close()
        }
    }

    private init(
        registry: any RegistryStore, engineRegistry: any RegistryStore, dispatches: DispatchStore, redis: RedisClient?,
        contentTimestamps: SharedContentTimestamps?, close: @escaping @Sendable () async -> Void
    ) {
        self.registry = registry
        self.engineRegistry = engineRegistry
        self.dispatches = dispatches
        self.redis = redis
        self.contentTimestamps = contentTimestamps
        closeAll = close
    }

    /// Closes the stores (and the Redis connections); what the registry's subscribers wait on ends.
    func close() async { await closeAll() }
}
