import FanoutCore

/// The request headers APNs reads, picked out of the received list in one pass, with duplicates detected.
struct ReceivedHeaders {
    var pushType: String?
    var topic: String?
    var priority: String?
    var expiration: String?
    var collapseID: String?
    var apnsID: String?
    var authorization: String?

    static func collect(_ headers: [(name: String, value: String)]) -> Result<ReceivedHeaders, APNsRejection> {
        var collected = ReceivedHeaders()
        var seen: UInt16 = 0
        for header in headers {
            let bit: UInt16
            switch header.name {
            case APNsHeaderName.pushType: bit = 1 << 0
            case APNsHeaderName.topic: bit = 1 << 1
            case APNsHeaderName.priority: bit = 1 << 2
            case APNsHeaderName.expiration: bit = 1 << 3
            case APNsHeaderName.collapseID: bit = 1 << 4
            case APNsHeaderName.apnsID: bit = 1 << 5
            case APNsHeaderName.authorization: bit = 1 << 6
            case APNsHeaderName.method: bit = 1 << 7
            case APNsHeaderName.scheme: bit = 1 << 8
            case APNsHeaderName.path: bit = 1 << 9
            case APNsHeaderName.authority: bit = 1 << 10
            default: continue
            }
            guard seen & bit == 0 else { return .failure(APNsRejection(.duplicateHeaders)) }
            seen |= bit
            switch bit {
            case 1 << 0: collected.pushType = header.value
            case 1 << 1: collected.topic = header.value
            case 1 << 2: collected.priority = header.value
            case 1 << 3: collected.expiration = header.value
            case 1 << 4: collected.collapseID = header.value
            case 1 << 5: collected.apnsID = header.value
            case 1 << 6: collected.authorization = header.value
            default: break
            }
        }
        return .success(collected)
    }
}
