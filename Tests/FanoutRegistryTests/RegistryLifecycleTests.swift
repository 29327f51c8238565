import FanoutRegistry
import XCTest

/// Registration, rotation, stop, expiry, ended activities, and the tokens APNs refuses.
class RegistryLifecycleTests: RegistryStoreTestCase {
    let app = "com.acme.app"

    func testRotationReplacesTheDevicesTokenAndTheOldOneIsNoLongerReturned() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let first = TestTokens.token(1)
        let second = TestTokens.token(2)

        var result = try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", userID: "u1", token: first)))
        XCTAssertEqual(result.events.map(\.change), [.added])
        clock.advance(milliseconds: 5_000)
        result = try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: second)))
        XCTAssertEqual(result.events.map(\.change), [.rotated])
        XCTAssertEqual(result.events.first?.token, second)

        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [second])
        XCTAssertEqual(live.first?.deviceID, "d1")

        // An older registration arriving late (a retry, a re-import) does not bring the old token back.
        result = try await store.register(
            .updateToken(
                .init(app: app, activityID: "match-7", deviceID: "d1", token: first, registeredAt: clock.now - 5_000)))
        XCTAssertEqual(result.events, [])
        XCTAssertEqual(result.unchanged, 1)
        let liveAgain = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(liveAgain.map(\.token), [second])
    }

    func testTokensWithoutADeviceAreEachTheirOwnRegistration() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let changes = (0..<3).map {
            RegistryChange.updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token($0)))
        }
        let result = try await store.apply(changes)
        XCTAssertEqual(result.added, 3)
        let again = try await store.apply(changes)
        XCTAssertEqual(again.events, [])
        XCTAssertEqual(again.unchanged, 3)
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(Set(live.map(\.token)), Set((0..<3).map { TestTokens.token($0) }))
    }

    func testATokenRegisteredWithAndWithoutItsDeviceIsHeldOnce() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let token = TestTokens.token(1)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: token)))
        let claimed = try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: token)))
        XCTAssertEqual(claimed.events, [], "the token was live all along")
        XCTAssertEqual(claimed.unchanged, 1)
        let again = try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: token)))
        XCTAssertEqual(again.events, [])
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [token])
        XCTAssertEqual(live.first?.deviceID, "d1")
    }

    func testAnEmptyTokenStopsTheDevicesTokenAndStopWithoutADeviceStopsAll() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        for index in 0..<3 {
            try await store.register(
                .updateToken(
                    .init(app: app, activityID: "match-7", deviceID: "d\(index)", token: TestTokens.token(index))))
        }
        let stopped = try await store.register(
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d0", token: "")))
        XCTAssertEqual(stopped.events.map(\.change), [.removed])
        XCTAssertEqual(stopped.events.map(\.reason), [.stopped])
        XCTAssertEqual(stopped.events.first?.token, TestTokens.token(0))
        var live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(Set(live.map(\.token)), [TestTokens.token(1), TestTokens.token(2)])

        let all = try await store.apply([.stopUpdateTokens(app: app, activityID: "match-7", deviceID: nil)])
        XCTAssertEqual(all.removed, 2)
        XCTAssertEqual(Set(all.events.compactMap(\.reason)), [.stopped])
        live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live, [])
    }

    func testUpdateTokensExpireEightHoursAfterRegistration() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token(1))))
        clock.advance(hours: 2)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token(2))))

        // 7 h 59 min after the first: both live.
        clock.advance(hours: 6)
        clock.advance(milliseconds: -60_000)
        var live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.count, 2)
        var stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 2)

        // Exactly 8 h after the first: it is no longer returned or counted, before any sweep.
        clock.advance(milliseconds: 60_000)
        live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [TestTokens.token(2)])
        stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 1)
        XCTAssertEqual(stats.expiredSwept, 0)

        let subscription = store.subscribe()
        let sweep = try await store.sweep()
        XCTAssertEqual(sweep.expired, 1)
        var iterator = subscription.makeAsyncIterator()
        let event = await iterator.next()
        XCTAssertEqual(event?.token, TestTokens.token(1))
        XCTAssertEqual(event?.change, .removed)
        XCTAssertEqual(event?.reason, .expired)
        stats = try await store.stats()
        XCTAssertEqual(stats.expiredSwept, 1)
        XCTAssertEqual(stats.updateTokens, 1)

        // A second sweep finds nothing more.
        let again = try await store.sweep()
        XCTAssertEqual(again.expired, 0)
    }

    func testTheTokenLifetimeIsConfigurable() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock) { $0.updateTokenLifetime = 3_600_000 }
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token(1))))
        clock.advance(hours: 1)
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live, [])
    }

    func testABackFilledRegistrationAlreadyPastItsLifetimeIsNotStored() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let result = try await store.register(
            .updateToken(
                .init(
                    app: app, activityID: "match-7", token: TestTokens.token(1),
                    registeredAt: clock.now - 9 * 3_600_000)))
        XCTAssertEqual(result.alreadyExpired, 1)
        XCTAssertEqual(result.events, [])
        let stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 0)
    }

    func testAnEndedActivityKeepsItsTokensUntilItsDismissalDate() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([
            .startActivity(app: app, activityID: "match-7", attributesType: "MatchAttributes"),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(1))),
            .updateToken(.init(app: app, activityID: "match-8", deviceID: "d1", token: TestTokens.token(2))),
        ])
        clock.advance(hours: 1)
        let dismissal = clock.now + 30 * 60_000
        try await store.apply([.endActivity(app: app, activityID: "match-7", dismissalDate: dismissal)])
        let activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(activity?.state, .ended)
        XCTAssertEqual(activity?.dismissalDate, dismissal)
        XCTAssertEqual(activity?.attributesType, "MatchAttributes")

        // Until the dismissal date the tokens are still there (an end event may still be sent to them).
        clock.advance(milliseconds: 30 * 60_000 - 1)
        var live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [TestTokens.token(1)])

        clock.advance(milliseconds: 1)
        live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live, [], "never returned once dismissed, swept or not")
        var stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 1)

        let subscription = store.subscribe()
        let sweep = try await store.sweep()
        XCTAssertEqual(sweep.ended, 1)
        XCTAssertEqual(sweep.activitiesRemoved, 1)
        var iterator = subscription.makeAsyncIterator()
        let event = await iterator.next()
        XCTAssertEqual(event?.activityID, "match-7")
        XCTAssertEqual(event?.token, TestTokens.token(1))
        XCTAssertEqual(event?.reason, .ended)
        let removed = try await store.activity(app: app, activityID: "match-7")
        XCTAssertNil(removed)
        stats = try await store.stats()
        XCTAssertEqual(stats.activities, 1)
        XCTAssertEqual(stats.updateTokens, 1)
        let other = try await store.allLiveTokens(activityID: "match-8", now: clock.now)
        XCTAssertEqual(other.map(\.token), [TestTokens.token(2)])
    }

    func testAnEndWithoutADismissalDateKeepsTheTokensFourHours() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token(1))))
        try await store.apply([.endActivity(app: app, activityID: "match-7", dismissalDate: nil)])
        clock.advance(hours: 4)
        clock.advance(milliseconds: -1)
        var live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.count, 1)
        clock.advance(milliseconds: 1)
        live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live, [])
    }

    func testANewTokenAfterTheEndStartsANewSessionUnderTheSameActivityID() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let oldToken = TestTokens.token(1)
        let newToken = TestTokens.token(2)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: oldToken)))
        clock.advance(hours: 1)
        let endedAt = clock.now
        try await store.apply([.endActivity(app: app, activityID: "match-7", dismissalDate: nil)])

        // The old session's token again, and a registration dated before the end, leave the activity ended.
        clock.advance(hours: 1)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: oldToken)))
        try await store.register(
            .updateToken(
                .init(app: app, activityID: "match-7", deviceID: "d2", token: newToken, registeredAt: endedAt - 1)))
        var activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(activity?.state, .ended)

        // The rematch reuses the id: a new token registered after the end makes the activity live again, so that
        // its updates reach the new token past the old dismissal date and the sweep keeps it.
        let rematch = TestTokens.token(3)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d3", token: rematch)))
        activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(activity?.state, .active)
        XCTAssertNil(activity?.dismissalDate)
        clock.advance(hours: 4)
        let sweep = try await store.sweep()
        XCTAssertEqual(sweep.ended, 0)
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertTrue(live.map(\.token).contains(rematch), "\(live)")
    }

    func testADismissalDateInThePastRemovesTheTokensAtOnce() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token(1))))
        let result = try await store.apply([
            .endActivity(app: app, activityID: "match-7", dismissalDate: clock.now - 1)
        ])
        XCTAssertEqual(result.events.map(\.reason), [.ended])
        let stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 0)
    }

    func testA410RemovesATokenRegisteredBeforeItsTimestampOnly() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let old = TestTokens.token(1)
        let renewed = TestTokens.token(2)
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: old)))
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d2", token: renewed)))
        let unregisteredAt = clock.now + 10 * 60_000
        clock.advance(hours: 1)
        // d2's device registered its token again after APNs's timestamp: APNs's 410 is older news.
        try await store.register(.updateToken(.init(app: app, activityID: "match-7", deviceID: "d2", token: renewed)))

        let first = try await store.recordUnregistered(token: old, timestamp: unregisteredAt)
        XCTAssertEqual(first.events.count, 1)
        XCTAssertEqual(first.events.first?.change, .removed)
        XCTAssertEqual(first.events.first?.reason, .unregistered)
        XCTAssertEqual(first.events.first?.activityID, "match-7")
        XCTAssertEqual(first.events.first?.deviceID, "d1")

        let second = try await store.recordUnregistered(token: renewed, timestamp: unregisteredAt)
        XCTAssertEqual(second.events, [])
        XCTAssertEqual(second.unchanged, 1)

        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [renewed])

        // A 410 without a timestamp (ExpiredToken) removes it whatever its registration time.
        let third = try await store.recordUnregistered(token: renewed, timestamp: nil)
        XCTAssertEqual(third.events.map(\.reason), [.unregistered])
    }

    func testA410KeepsATokenRegisteredAgainSecondsAfterItsTimestamp() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock, apps: [app, "com.acme.other"])
        let token = TestTokens.token(1)
        let registeredAt = clock.now
        try await store.apply(registrationsOfOneToken(token))
        // The device registers the token again 30 s later; APNs's 410 is dated between the two registrations, so
        // the device registered it again after APNs learned it was invalid: the token stays everywhere.
        clock.advance(milliseconds: 30_000)
        let again = try await store.apply(registrationsOfOneToken(token))
        XCTAssertEqual(again.events, [])
        let kept = try await store.recordUnregistered(token: token, timestamp: registeredAt + 10_000)
        XCTAssertEqual(kept.events, [])
        XCTAssertEqual(kept.unchanged, 1)
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [token])

        // A 410 dated after the second registration removes it from all three kinds of registration.
        let removed = try await store.recordUnregistered(token: token, timestamp: registeredAt + 30_001)
        XCTAssertEqual(Set(removed.events.map(\.kind)), [.update, .pushToStart, .push])
        XCTAssertTrue(removed.events.allSatisfy { $0.reason == .unregistered })
    }

    /// A 410 dated within the first minute after the token's only registration removes it, and the same 410 coming
    /// again later (APNs dates a 410 with the time it learned of the token's end, which later sends do not move)
    /// finds nothing left to remove.
    func testA410DatedSecondsAfterTheOnlyRegistrationRemovesTheToken() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock, apps: [app, "com.acme.other"])
        let token = TestTokens.token(1)
        let registeredAt = clock.now
        try await store.apply(registrationsOfOneToken(token))
        clock.advance(milliseconds: 30_000)
        let removed = try await store.recordUnregistered(token: token, timestamp: registeredAt + 20_000)
        XCTAssertEqual(Set(removed.events.map(\.kind)), [.update, .pushToStart, .push])
        XCTAssertTrue(removed.events.allSatisfy { $0.reason == .unregistered })
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live, [])

        clock.advance(hours: 1)
        let again = try await store.recordUnregistered(token: token, timestamp: registeredAt + 20_000)
        XCTAssertEqual(again.events, [])
    }

    /// One token registered as an update token, a push-to-start token (of another app) and a device push token.
    private func registrationsOfOneToken(_ token: String) -> [RegistryChange] {
        [
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: token)),
            .pushToStartToken(.init(app: "com.acme.other", deviceID: "d1", token: token)),
            .device(.init(app: app, deviceID: "d2", pushToken: token)),
        ]
    }

    func testBadDeviceTokenRemovesTheTokenAtOnceWhereverItIsRegistered() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock, apps: ["com.acme.app", "com.acme.other"])
        let token = TestTokens.token(7)
        try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", token: token)),
            .pushToStartToken(.init(app: "com.acme.other", deviceID: "d1", token: token)),
            .device(.init(app: app, deviceID: "d2", pushToken: token)),
            .updateToken(.init(app: app, activityID: "match-7", token: TestTokens.token(8))),
        ])
        clock.advance(hours: 3)
        let result = try await store.recordInvalid(token: token.uppercased())
        XCTAssertEqual(Set(result.events.map(\.kind)), [.update, .pushToStart, .push])
        XCTAssertTrue(result.events.allSatisfy { $0.token == token && $0.reason == .unregistered })
        XCTAssertEqual(Set(result.events.map(\.app)), ["com.acme.app", "com.acme.other"])

        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [TestTokens.token(8)])
        let starts = try await store.pushToStartTokens(
            app: "com.acme.other", attributesType: nil, selection: .all, after: nil, limit: 10)
        XCTAssertEqual(starts.items, [])
        let devices = try await store.devices(app: app, selection: .devices(["d2"]), after: nil, limit: 10)
        XCTAssertEqual(devices.items.map(\.pushToken), [nil])
    }

    /// APNs answers for the topic a notification was sent with: a token it refuses for one topic stays wherever
    /// another app (another workspace's, say) registered it, and where its own app holds it as another kind (a
    /// Live Activity topic reaches update and push-to-start tokens, the bare bundle id devices' push tokens); a
    /// topic no app has reaches nothing.
    func testAnInvalidatedTokenIsRemovedOnlyWhereItsTopicReaches() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let other = "com.beta.app"
        let store = try await makeStore(in: directory, clock: clock, apps: [app, other])
        let token = TestTokens.token(7)
        try await store.apply([
            .updateToken(.init(app: app, activityID: "match-7", token: token)),
            .pushToStartToken(.init(app: other, deviceID: "d1", token: token)),
            .device(.init(app: other, deviceID: "d2", pushToken: token)),
        ])
        clock.advance(hours: 3)
        func pushToStart() async throws -> [String] {
            try await store.pushToStartTokens(app: other, attributesType: nil, selection: .all, after: nil, limit: 10)
                .items.map(\.token)
        }
        func devicePush() async throws -> [String?] {
            try await store.devices(app: other, selection: .devices(["d2"]), after: nil, limit: 10).items.map(
                \.pushToken)
        }

        let unknown = try await store.recordInvalid(token: token, topic: "com.unknown.app.push-type.liveactivity")
        XCTAssertEqual(unknown.events, [])
        let alert = try await store.recordInvalid(token: token, topic: other)
        XCTAssertEqual(alert.events.map(\.kind), [.push])
        let pushAfterAlert = try await devicePush()
        XCTAssertEqual(pushAfterAlert, [nil])
        let startsAfterAlert = try await pushToStart()
        XCTAssertEqual(startsAfterAlert, [token], "the app's push-to-start token is not its push token")
        let notForTopic = try await store.recordInvalid(token: token, topic: other + ".push-type.liveactivity")
        XCTAssertEqual(notForTopic.events.map(\.kind), [.pushToStart])
        XCTAssertEqual(Set(notForTopic.events.map(\.app)), [other])
        let startsAfterLive = try await pushToStart()
        XCTAssertEqual(startsAfterLive, [])
        let live = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(live.map(\.token), [token], "another app's registration stays")

        try await store.apply([.device(.init(app: other, deviceID: "d2", pushToken: token))])
        clock.advance(hours: 1)
        let gone = try await store.recordUnregistered(
            token: token, timestamp: clock.now, topic: app + ".push-type.liveactivity")
        XCTAssertEqual(gone.events.map(\.kind), [.update])
        let left = try await store.allLiveTokens(activityID: "match-7", now: clock.now)
        XCTAssertEqual(left.map(\.token), [])
        let pushAfter410 = try await devicePush()
        XCTAssertEqual(pushAfter410, [token], "the 410 for one app keeps the other's")
    }

    func testContentTimestampsAndChannelsAreRecordedOnTheActivity() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([
            .contentSent(app: app, activityID: "match-7", timestamp: 1_764_460_900),
            .contentSent(app: app, activityID: "match-7", timestamp: 1_764_460_800),
            .channel(app: app, activityID: "match-7", channelID: "dHN0LTE="),
        ])
        let activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(activity?.lastContentTimestamp, 1_764_460_900)
        XCTAssertEqual(activity?.channelID, "dHN0LTE=")
        XCTAssertEqual(activity?.state, .active)
        XCTAssertNil(activity?.channelStoragePolicy, "bound without its policy: unknown")
        XCTAssertNil(activity?.channelEnvironment, "bound without its environment: unknown")
        let stats = try await store.stats()
        XCTAssertEqual(stats.liveActivities, 1, "a channel makes an activity live without tokens")

        // Bound with its policy, it reads back; unbinding forgets it; a policy other than 0 or 1 is refused.
        try await store.apply([
            .channel(
                app: app, activityID: "match-7", channelID: "dHN0LTI=", storagePolicy: 1, environment: "production")
        ])
        var rebound = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(rebound?.channelID, "dHN0LTI=")
        XCTAssertEqual(rebound?.channelStoragePolicy, 1)
        XCTAssertEqual(rebound?.channelEnvironment, "production", "where it was created")
        // Only if unbound: a bound activity keeps its channel and policy.
        try await store.apply([
            .channel(app: app, activityID: "match-7", channelID: "dHN0LTk=", storagePolicy: 0, onlyIfUnbound: true)
        ])
        rebound = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(rebound?.channelID, "dHN0LTI=")
        XCTAssertEqual(rebound?.channelStoragePolicy, 1)
        XCTAssertEqual(rebound?.channelEnvironment, "production")
        try await store.apply([
            .channel(
                app: app, activityID: "match-7", channelID: nil, storagePolicy: 1, environment: "development")
        ])
        rebound = try await store.activity(app: app, activityID: "match-7")
        XCTAssertNil(rebound?.channelID)
        XCTAssertNil(rebound?.channelStoragePolicy)
        XCTAssertNil(rebound?.channelEnvironment, "unbinding forgets the environment")
        try await store.apply([
            .channel(app: app, activityID: "match-7", channelID: "dHN0LTk=", storagePolicy: 0, onlyIfUnbound: true)
        ])
        rebound = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(rebound?.channelID, "dHN0LTk=", "an unbound activity is bound")
        XCTAssertEqual(rebound?.channelStoragePolicy, 0)
        try await store.apply([.channel(app: app, activityID: "match-7", channelID: nil)])
        let refused = await assertRegistryError(.invalidInput) {
            try await store.apply([
                .channel(app: self.app, activityID: "match-7", channelID: "dHN0LTM=", storagePolicy: 2)
            ])
        }
        XCTAssertEqual(refused?.field, "storage_policy")
    }

    func testStatsCountWhatProductMdLists() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock, apps: ["com.acme.app", "com.acme.other"])
        try await store.apply([
            .updateToken(
                .init(app: app, activityID: "match-7", deviceID: "d1", userID: "u1", token: TestTokens.token(1))),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d2", token: TestTokens.token(2))),
            .updateToken(.init(app: app, activityID: "match-8", token: TestTokens.token(3))),
            .pushToStartToken(
                .init(app: app, deviceID: "d1", attributesType: "MatchAttributes", token: TestTokens.token(4))),
            .device(.init(app: "com.acme.other", deviceID: "x", pushToken: TestTokens.token(5))),
        ])
        try await store.apply([.endActivity(app: app, activityID: "match-8", dismissalDate: nil)])
        let stats = try await store.stats()
        XCTAssertEqual(stats.apps, 2)
        XCTAssertEqual(stats.devices, 3)
        XCTAssertEqual(stats.activities, 2)
        XCTAssertEqual(stats.liveActivities, 1)
        XCTAssertEqual(stats.updateTokens, 3)
        XCTAssertEqual(stats.pushToStartTokens, 1)
        XCTAssertEqual(stats.expiredSwept, 0)
        XCTAssertEqual(
            stats.jsonLine,
            #"{"apps":2,"devices":3,"activities":2,"live_activities":1,"update_tokens":3,"push_to_start_tokens":1,"#
                + #""expired_swept":0}"#)
    }

    // Moved here from RegistryImportTests: it is the store's behaviour (validation before any write), so it runs on
    // both stores.
    func testABatchWithOneBadChangeWritesNothing() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        let cases: [(RegistryChange, String)] = [
            (.updateToken(.init(app: app, activityID: "m", token: "12345")), "token"),
            (
                .updateToken(
                    .init(app: app, activityID: String(repeating: "é", count: 129), token: TestTokens.token(2))),
                "activity_id"
            ),
            (.updateToken(.init(app: "com.other", activityID: "m", token: TestTokens.token(2))), "app"),
            (.pushToStartToken(.init(app: app, deviceID: "", token: TestTokens.token(2))), "device"),
            (.device(.init(app: app, deviceID: "d", pushToken: "zz")), "push_token"),
            (.unregistered(token: "", timestamp: nil), "token"),
        ]
        for (bad, field) in cases {
            let error = await assertRegistryError(.invalidInput, field: field) {
                try await store.apply([
                    .updateToken(.init(app: self.app, activityID: "m", token: TestTokens.token(1))), bad,
                ])
            }
            XCTAssertTrue(error?.message.hasPrefix("change 1: ") ?? false, "\(String(describing: error))")
        }
        let stats = try await store.stats()
        XCTAssertEqual(stats.updateTokens, 0)
        XCTAssertEqual(stats.activities, 0)
        let events = try await store.allEvents()
        XCTAssertEqual(events, [])
        await assertRegistryError(.invalidInput, field: "app") {
            try await store.defineApps([RegistryApp(bundleID: "")])
        }
    }

    func testEndedChannelsAreListedFromTheDismissalUntilUnbound() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([
            .startActivity(app: app, activityID: "match-7", attributesType: nil),
            .channel(app: app, activityID: "match-7", channelID: "Y2gtMQ==", environment: "development"),
            .updateToken(.init(app: app, activityID: "match-7", deviceID: "d1", token: TestTokens.token(1))),
            .updateToken(.init(app: app, activityID: "match-8", token: TestTokens.token(2))),
        ])
        var count = try await store.liveUpdateTokenCount(app: app, activityID: "match-7", now: clock.now)
        XCTAssertEqual(count, 1)
        try await store.apply([.endActivity(app: app, activityID: "match-7", dismissalDate: clock.now + 600_000)])
        var channels = try await store.endedChannels(now: clock.now, limit: 10)
        XCTAssertEqual(channels, [], "not before the dismissal date")
        clock.advance(milliseconds: 600_000)
        channels = try await store.endedChannels(now: clock.now, limit: 10)
        XCTAssertEqual(
            channels,
            [EndedChannel(app: app, activityID: "match-7", channelID: "Y2gtMQ==", environment: "development")],
            "with the environment it was created in")
        count = try await store.liveUpdateTokenCount(app: app, activityID: "match-7", now: clock.now)
        XCTAssertEqual(count, 0, "a dismissed activity has no live tokens, swept or not")

        // The sweep removes the tokens but keeps the activity while its channel is bound.
        let first = try await store.sweep()
        XCTAssertEqual(first.ended, 1)
        var activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertEqual(activity?.channelID, "Y2gtMQ==")
        channels = try await store.endedChannels(now: clock.now, limit: 10)
        XCTAssertEqual(channels.map(\.activityID), ["match-7"])

        try await store.apply([.channel(app: app, activityID: "match-7", channelID: nil)])
        let second = try await store.sweep()
        XCTAssertEqual(second.activitiesRemoved, 1)
        activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertNil(activity)
        channels = try await store.endedChannels(now: clock.now, limit: 10)
        XCTAssertEqual(channels, [])
        count = try await store.liveUpdateTokenCount(app: app, activityID: "match-8", now: clock.now)
        XCTAssertEqual(count, 1)

        // Oldest dismissal first; `skipping` pages past the ones a caller leaves bound.
        try await store.apply([
            .channel(app: app, activityID: "late", channelID: "bGF0ZQ=="),
            .channel(app: app, activityID: "early", channelID: "ZWFybHk="),
            .endActivity(app: app, activityID: "late", dismissalDate: clock.now - 1_000),
            .endActivity(app: app, activityID: "early", dismissalDate: clock.now - 2_000),
        ])
        channels = try await store.endedChannels(now: clock.now, limit: 10)
        XCTAssertEqual(channels.map(\.activityID), ["early", "late"])
        channels = try await store.endedChannels(now: clock.now, limit: 10, skipping: 1)
        XCTAssertEqual(channels.map(\.activityID), ["late"])
        channels = try await store.endedChannels(now: clock.now, limit: 10, skipping: 2)
        XCTAssertEqual(channels, [])
    }

    func testAnActivityWithNothingLeftIsRemovedATokenLifetimeAfterItsLastChange() async throws {
        let directory = try ScratchDirectory()
        let clock = TestClock()
        let store = try await makeStore(in: directory, clock: clock)
        try await store.apply([
            .contentSent(app: app, activityID: "match-7", timestamp: 1_764_460_800),
            .updateToken(.init(app: app, activityID: "match-8", token: TestTokens.token(1))),
        ])
        clock.advance(hours: 7)
        var sweep = try await store.sweep()
        XCTAssertEqual(sweep.activitiesRemoved, 0)
        clock.advance(hours: 1)
        sweep = try await store.sweep()
        XCTAssertEqual(sweep.expired, 1)
        let stats = try await store.stats()
        XCTAssertEqual(stats.activities, 0, "both idle for a token lifetime: removed")
        let activity = try await store.activity(app: app, activityID: "match-7")
        XCTAssertNil(activity)
    }
}
