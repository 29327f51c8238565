import CommandLineSupport
import Foundation

let usage = """
    fanout: send APNs notifications (Live Activity updates and regular pushes) to many devices.

    usage: fanout <command> [options]

    commands:
      send      send every job of a job file, with results, summary and resume (fanout send --help)
      validate  check a job file line by line; nothing is sent (fanout validate --help)
      append    append checked job lines to a job file that fanout send --follow reads (fanout append --help)
      push      send one notification and print APNs's answer (fanout push --help)
      registry  the token registry: register, import, list, end, prune, stats, events (fanout registry --help)
      channels  an app's broadcast channels (iOS 18): create, read, delete, list (fanout channels --help)
      serve     the Live Activity HTTP service: native, Pushwoosh and Braze APIs (fanout serve --help)
      enqueue   split a job file's jobs into shards on Redis for the fleet (fanout enqueue --help)
      worker    send the fleet's shards from Redis (fanout worker --help)
      results   a fleet job's results from Redis, one line per (job, token), and the summary
      status    the fleet's jobs on Redis: shards done, counts
    """

signal(SIGPIPE, SIG_IGN)
var arguments = Array(CommandLine.arguments.dropFirst())
let command = arguments.isEmpty ? "--help" : arguments.removeFirst()
let status: Int32
switch command {
case "send":
    status = await SendCommand.run(arguments)
case "validate":
    status = ValidateCommand.run(arguments)
case "append":
    status = AppendCommand.run(arguments)
case "push":
    status = await PushCommand.run(arguments)
case "registry":
    status = await RegistryCommand.run(arguments)
case "channels":
    status = await ChannelsCommand.run(arguments)
case "serve":
    status = await ServeCommand.run(arguments)
case "enqueue":
    status = await FleetCommands.enqueue(arguments)
case "worker":
    status = await FleetCommands.worker(arguments)
case "results":
    status = await FleetCommands.results(arguments)
case "status":
    status = await FleetCommands.status(arguments)
case "--help", "-h", "help":
    print(usage)
    status = 0
default:
    StandardStream.error.write("fanout: unknown command '\(command)' (see fanout --help)\n")
    status = 2
}
exit(status)
