import Foundation

let usage = """
    fanout: send APNs notifications (Live Activity updates and regular pushes) to many devices.

    usage: fanout <command> [options]

    commands:
      push      send one notification and print APNs's answer (fanout push --help)

    The job-file driver (fanout send, fanout validate) arrives with the fan-out engine.
    """

signal(SIGPIPE, SIG_IGN)
var arguments = Array(CommandLine.arguments.dropFirst())
let command = arguments.isEmpty ? "--help" : arguments.removeFirst()
let status: Int32
switch command {
case "push":
    status = await PushCommand.run(arguments)
case "--help", "-h", "help":
    print(usage)
    status = 0
default:
    FileHandle.standardError.write(Data("fanout: unknown command '\(command)' (see fanout --help)\n".utf8))
    status = 2
}
exit(status)
