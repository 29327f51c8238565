import Foundation

/// How many times slower than a plain build this test run is expected to be: `scripts/sanitize.sh` sets
/// `FANOUT_TIME_SCALE` (10 under ThreadSanitizer, 3 under AddressSanitizer), 1 otherwise. A bound on elapsed time
/// that stands for a promise to users ("cancelling returns within a second") is multiplied by it, so that a
/// sanitizer run checks the same promise rather than the sanitizer's overhead. (Every test target links this
/// module, so they all read the same scale.)
package let testTimeScale: Double = {
    guard let text = ProcessInfo.processInfo.environment["FANOUT_TIME_SCALE"], let scale = Double(text), scale >= 1
    else { return 1 }
    return scale
}()
