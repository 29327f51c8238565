import FanoutCore
import Foundation
import XCTest

final class FanoutMutexTests: XCTestCase {
    func testIncrementsFromFourThreadsAreAllCounted() {
        final class Shared: Sendable {
            let counter = FanoutMutex(0)
        }
        let shared = Shared()
        let perThread = 20_000
        let threads = (0..<4).map { _ in
            TestThread {
                for _ in 0..<perThread { shared.counter.withLock { $0 += 1 } }
            }
        }
        for thread in threads { thread.join() }
        XCTAssertEqual(shared.counter.withLock { $0 }, 4 * perThread)
    }

    func testWithLockReturnsAndThrowsWhatTheBodyDoes() {
        struct Refused: Error {}
        let names = FanoutMutex(["a"])
        XCTAssertEqual(
            names.withLock { names -> Int in
                names.append("b"); return names.count
            }, 2)
        XCTAssertThrowsError(try names.withLock { _ throws(Refused) in throw Refused() }) { error in
            XCTAssertTrue(error is Refused)
        }
        XCTAssertEqual(names.withLock { $0 }, ["a", "b"])
    }

    /// A ThreadSanitizer build must use the lock it sees (`FANOUT_TSAN`, set by scripts/sanitize.sh), or every lock
    /// hand-off it misses would be reported as a race; a normal build must use `Mutex`.
    func testTheLockIsThePthreadMutexExactlyInThreadSanitizerBuilds() {
        // The ThreadSanitizer runtime, linked into the test executable only in a `--sanitize=thread` build, exports
        // __tsan_acquire (its annotation interface).
        let underThreadSanitizer = dlsym(nil, "__tsan_acquire") != nil
        XCTAssertEqual(
            fanoutMutexIsPthreadMutex, underThreadSanitizer,
            underThreadSanitizer
                ? "a ThreadSanitizer build without -Xswiftc -DFANOUT_TSAN: it cannot see Synchronization.Mutex"
                : "FANOUT_TSAN set in a build without ThreadSanitizer")
    }
}

/// The check that a ThreadSanitizer run can see a race at all: scripts/sanitize.sh runs this test a second time
/// with `FANOUT_TSAN_CANARY=1` and fails unless ThreadSanitizer reports the race on `Counter.value` it makes then.
///
/// Two threads each add to a counter no lock guards. Normally the second starts only after the first is joined
/// (`pthread_join` orders them, and ThreadSanitizer knows it), so there is no race and the total is exact. With
/// `FANOUT_TSAN_CANARY=1` both run at once with nothing ordering them: a data race, which the run must report.
final class ThreadSanitizerCanaryTests: XCTestCase {
    /// Deliberately unsynchronised (@unchecked).
    final class Counter: @unchecked Sendable {
        var value = 0
    }

    func testUnsynchronisedCounter() {
        let racing = ProcessInfo.processInfo.environment["FANOUT_TSAN_CANARY"] == "1"
        let counter = Counter()
        let rounds = 10_000
        let work = { @Sendable in
            for _ in 0..<rounds { counter.value += 1 }
        }
        if racing {
            let first = TestThread(work)
            let second = TestThread(work)
            first.join()
            second.join()
            // Lost updates are possible, and are the point: only that both threads ran is certain.
            XCTAssertGreaterThan(counter.value, 0)
        } else {
            TestThread(work).join()
            TestThread(work).join()
            XCTAssertEqual(counter.value, 2 * rounds)
        }
    }
}

/// A thread that runs `body` at once, and `join()` to wait for it: pthread_create and pthread_join, which
/// ThreadSanitizer intercepts (so `join()` orders the thread's work before what follows it).
final class TestThread {
    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }
    private var thread = pthread_t()
    private var joined = false

    init(_ body: @escaping @Sendable () -> Void) {
        // Retained for the thread, which releases it when `body` returns.
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        let status = pthread_create(
            &thread, nil,
            { context in
                let body = Unmanaged<Body>.fromOpaque(context!).takeRetainedValue()
                body.run()
                return nil
            }, context)
        precondition(status == 0, "pthread_create failed (\(status))")
    }

    func join() {
        guard !joined else { return }
        joined = true
        pthread_join(thread, nil)
    }

    deinit { join() }
}
