import Foundation
import XCTest

// The behaviour tests again, on `RedisRegistryStore`. Each subclass runs its SQLite class's tests with `makeStore`
// opening a Redis store on a redis-server of its own. XCTest on Linux does not run inherited test methods (test
// discovery lists only the methods a class declares: a subclass with none ran 0 tests), so each one is re-declared
// here, calling the inherited body; `testEveryBehaviourTestRunsOnRedis` fails when a new test is missing here.

final class RedisRegistryLifecycleTests: RegistryLifecycleTests {
    override class var storeKind: RegistryStoreKind { .redis }

    override func testRotationReplacesTheDevicesTokenAndTheOldOneIsNoLongerReturned() async throws {
        try await super.testRotationReplacesTheDevicesTokenAndTheOldOneIsNoLongerReturned()
    }
    override func testTokensWithoutADeviceAreEachTheirOwnRegistration() async throws {
        try await super.testTokensWithoutADeviceAreEachTheirOwnRegistration()
    }
    override func testATokenRegisteredWithAndWithoutItsDeviceIsHeldOnce() async throws {
        try await super.testATokenRegisteredWithAndWithoutItsDeviceIsHeldOnce()
    }
    override func testAnEmptyTokenStopsTheDevicesTokenAndStopWithoutADeviceStopsAll() async throws {
        try await super.testAnEmptyTokenStopsTheDevicesTokenAndStopWithoutADeviceStopsAll()
    }
    override func testUpdateTokensExpireEightHoursAfterRegistration() async throws {
        try await super.testUpdateTokensExpireEightHoursAfterRegistration()
    }
    override func testTheTokenLifetimeIsConfigurable() async throws {
        try await super.testTheTokenLifetimeIsConfigurable()
    }
    override func testABackFilledRegistrationAlreadyPastItsLifetimeIsNotStored() async throws {
        try await super.testABackFilledRegistrationAlreadyPastItsLifetimeIsNotStored()
    }
    override func testAnEndedActivityKeepsItsTokensUntilItsDismissalDate() async throws {
        try await super.testAnEndedActivityKeepsItsTokensUntilItsDismissalDate()
    }
    override func testAnEndWithoutADismissalDateKeepsTheTokensFourHours() async throws {
        try await super.testAnEndWithoutADismissalDateKeepsTheTokensFourHours()
    }
    override func testANewTokenAfterTheEndStartsANewSessionUnderTheSameActivityID() async throws {
        try await super.testANewTokenAfterTheEndStartsANewSessionUnderTheSameActivityID()
    }
    override func testADismissalDateInThePastRemovesTheTokensAtOnce() async throws {
        try await super.testADismissalDateInThePastRemovesTheTokensAtOnce()
    }
    override func testA410RemovesATokenRegisteredBeforeItsTimestampOnly() async throws {
        try await super.testA410RemovesATokenRegisteredBeforeItsTimestampOnly()
    }
    override func testA410KeepsATokenRegisteredAgainSecondsAfterItsTimestamp() async throws {
        try await super.testA410KeepsATokenRegisteredAgainSecondsAfterItsTimestamp()
    }
    override func testA410DatedSecondsAfterTheOnlyRegistrationRemovesTheToken() async throws {
        try await super.testA410DatedSecondsAfterTheOnlyRegistrationRemovesTheToken()
    }
    override func testBadDeviceTokenRemovesTheTokenAtOnceWhereverItIsRegistered() async throws {
        try await super.testBadDeviceTokenRemovesTheTokenAtOnceWhereverItIsRegistered()
    }
    override func testAnInvalidatedTokenIsRemovedOnlyWhereItsTopicReaches() async throws {
        try await super.testAnInvalidatedTokenIsRemovedOnlyWhereItsTopicReaches()
    }
    override func testContentTimestampsAndChannelsAreRecordedOnTheActivity() async throws {
        try await super.testContentTimestampsAndChannelsAreRecordedOnTheActivity()
    }
    override func testStatsCountWhatProductMdLists() async throws { try await super.testStatsCountWhatProductMdLists() }
    override func testABatchWithOneBadChangeWritesNothing() async throws {
        try await super.testABatchWithOneBadChangeWritesNothing()
    }
    override func testEndedChannelsAreListedFromTheDismissalUntilUnbound() async throws {
        try await super.testEndedChannelsAreListedFromTheDismissalUntilUnbound()
    }
    override func testAnActivityWithNothingLeftIsRemovedATokenLifetimeAfterItsLastChange() async throws {
        try await super.testAnActivityWithNothingLeftIsRemovedATokenLifetimeAfterItsLastChange()
    }
}

final class RedisRegistryReadTests: RegistryReadTests {
    override class var storeKind: RegistryStoreKind { .redis }
    /// Scaled for Redis only (see `RegistryReadTests.pagingTokens`).
    override class var pagingTokens: Int { 25_000 }

    override func testPagingThrough100000TokensReturnsEachLiveOneExactlyOnce() async throws {
        try await super.testPagingThrough100000TokensReturnsEachLiveOneExactlyOnce()
    }
    override func testATokenRegisteredWhilePagingIsReachedAndNoneIsRepeated() async throws {
        try await super.testATokenRegisteredWhilePagingIsReachedAndNoneIsRepeated()
    }
    override func testAnUnknownActivityHasNoTokensAndAForeignCursorIsRefused() async throws {
        try await super.testAnUnknownActivityHasNoTokensAndAForeignCursorIsRefused()
    }
    override func testPushToStartTokensByUserDeviceAndAttributesType() async throws {
        try await super.testPushToStartTokensByUserDeviceAndAttributesType()
    }
    override func testDevicesAndTheirPushTokens() async throws { try await super.testDevicesAndTheirPushTokens() }
    override func testDevicesFoundByTheirPushTokens() async throws {
        try await super.testDevicesFoundByTheirPushTokens()
    }
    override func testUpdateTokensOfADevice() async throws { try await super.testUpdateTokensOfADevice() }
    override func testPagingGoesOnAfterTheCursorsTokenIsStoppedAndAReturnedOneRotates() async throws {
        try await super.testPagingGoesOnAfterTheCursorsTokenIsStoppedAndAReturnedOneRotates()
    }
    override func testATokenRegisteredAgainWhilePagingIsNotReturnedASecondTime() async throws {
        try await super.testATokenRegisteredAgainWhilePagingIsNotReturnedASecondTime()
    }
    override func testATokenTakenOverByADeviceWhilePagingIsNotReturnedASecondTime() async throws {
        try await super.testATokenTakenOverByADeviceWhilePagingIsNotReturnedASecondTime()
    }
    override func testATokenRegisteredAfterTheCursorsTokenWentIsReached() async throws {
        try await super.testATokenRegisteredAfterTheCursorsTokenWentIsReached()
    }
}

final class RedisRegistryEventTests: RegistryEventTests {
    override class var storeKind: RegistryStoreKind { .redis }

    override func testEveryChangeReachesEverySubscriberAndTheLogInOrder() async throws {
        try await super.testEveryChangeReachesEverySubscriberAndTheLogInOrder()
    }
    override func testTheEventJSONLineIsProductMdsShape() { super.testTheEventJSONLineIsProductMdsShape() }
    override func testChangesThatChangeNothingLogNothing() async throws {
        try await super.testChangesThatChangeNothingLogNothing()
    }
    override func testClosingTheStoreEndsTheStreams() async throws {
        try await super.testClosingTheStoreEndsTheStreams()
    }
    override func testSweepsDropEventsOlderThanTheRetentionButKeepTheNewest() async throws {
        try await super.testSweepsDropEventsOlderThanTheRetentionButKeepTheNewest()
    }
}
/// Every test of the behaviour classes is re-declared in its Redis subclass (this file), so that none runs on SQLite
/// only by oversight.
final class RedisRegistryCoverageTests: XCTestCase {
    func testEveryBehaviourTestRunsOnRedis() throws {
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        func tests(in file: String, pattern: String) throws -> Set<String> {
            let source = try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
            let expression = try NSRegularExpression(pattern: pattern, options: [.anchorsMatchLines])
            let range = NSRange(source.startIndex..., in: source)
            return Set(
                expression.matches(in: source, range: range).compactMap { match in
                    Range(match.range(at: 1), in: source).map { String(source[$0]) }
                })
        }
        let redis = try tests(in: "RedisRegistryTests.swift", pattern: #"^    override func (test\w+)\("#)
        for file in ["RegistryLifecycleTests.swift", "RegistryReadTests.swift", "RegistryEventTests.swift"] {
            let declared = try tests(in: file, pattern: #"^    func (test\w+)\("#)
            XCTAssertEqual(
                declared.subtracting(redis), [], "\(file): tests not re-declared in RedisRegistryTests.swift")
        }
    }
}
