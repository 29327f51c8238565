import FanoutCore
import FanoutTransport
import Foundation
import Synchronization
import XCTest

/// `LoopThread.execute` from the loop's own thread: the task runs before the loop blocks, without a wake-up written
/// to the loop's pipe, and a chain of such tasks neither stalls nor keeps the loop from other threads' work.
final class LoopThreadTests: XCTestCase {
    func testTasksTheLoopQueuesForItselfRunWithoutAWakeUp() {
        let loop = LoopThread(name: "loop-test")
        defer { loop.shutdown() }
        let done = DispatchSemaphore(value: 0)
        let ran = FanoutMutex(0)
        let chain = 100  // far more than the prepare callback runs in one turn: the rest need the idle handle
        @Sendable func step(_ remaining: Int) {
            ran.withLock { $0 += 1 }
            guard remaining > 0 else {
                done.signal()
                return
            }
            do { try loop.execute { step(remaining - 1) } } catch { XCTFail("execute on the loop: \(error)") }
        }
        let before = loop.wakeUpsSent
        try? loop.execute { step(chain) }
        // Nothing but the chain itself ever wakes the loop after the first task: a task left waiting would wait for good.
        XCTAssertEqual(done.wait(timeout: .now() + 20), .success, "a task queued from the loop never ran")
        XCTAssertEqual(ran.withLock { $0 }, chain + 1)
        XCTAssertEqual(loop.wakeUpsSent - before, 1, "only the first task, from this thread, wakes the loop")
    }

    func testATaskThatKeepsQueuingItselfLeavesRoomForOtherThreadsWork() {
        let loop = LoopThread(name: "loop-test")
        defer { loop.shutdown() }
        let stop = Atomic<Bool>(false)
        let stopped = DispatchSemaphore(value: 0)
        let turns = Atomic<Int>(0)
        @Sendable func spin() {
            turns.add(1, ordering: .relaxed)
            if stop.load(ordering: .relaxed) {
                stopped.signal()
                return
            }
            try? loop.execute { spin() }
        }
        try? loop.execute { spin() }
        let deadline = Date().addingTimeInterval(20)
        while turns.load(ordering: .relaxed) < 1_000 && Date() < deadline { usleep(1_000) }
        XCTAssertGreaterThanOrEqual(turns.load(ordering: .relaxed), 1_000, "the task stopped being run")
        // Run on the loop, between the spinning task's turns: only reached if the loop still reads its pipe.
        try? loop.execute { stop.store(true, ordering: .relaxed) }
        XCTAssertEqual(stopped.wait(timeout: .now() + 20), .success, "work from another thread never ran")
    }
}
