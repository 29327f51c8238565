// The request validator is its own module (MockAPNsValidation, pure Swift, so that the fuzzer can build it without
// the transport); whoever imports the mock gets it with it.
@_exported import MockAPNsValidation
