// The job-file format (line reader, line parser, `ParsedJob`) lives in FanoutJobFormat, which needs only FanoutCore
// so that the fuzzer can build it without the transport; whoever imports the driver gets the format with it.
@_exported import FanoutJobFormat
