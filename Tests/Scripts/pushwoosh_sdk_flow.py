#!/usr/bin/env python3
"""Plays the Pushwoosh iOS SDK's calls and a backend's Live Activity calls against `fanout serve`.

The device side sends what PWRequestManager sends (POST <base>/json/1.3/<method>, {"request": {...}} with
application, hwid, userId, v, device_type; Authorization: Token <device key>); the server side calls
startLiveActivity and updateLiveActivity with the server key in "auth". Every response is checked field by field
against Pushwoosh's rules: HTTP 200, a JSON object with status_code 200, status_message "OK" and response, and never
a base_url (which would move the SDK to another host for good).

usage: pushwoosh_sdk_flow.py BASE_URL APPLICATION DEVICE_KEY SERVER_KEY PUSH_TOKEN PUSH_TO_START_TOKEN ACTIVITY_TOKEN
Prints one JSON line {"start": ID, "update": ID, "after_stop": ID, "end": ID}; exits 1 naming the first mismatch.
"""
import json
import sys
import urllib.error
import urllib.request

base, application, device_key, server_key, push_token, start_token, activity_token = sys.argv[1:8]
HWID = "hwid-0001"
USER = "user-7"
ACTIVITY = "match-9"


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def call(method, request, token=None, expect_http=200):
    body = json.dumps({"request": request}).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if token is not None:
        headers["Authorization"] = "Token " + token
    req = urllib.request.Request(base + "/json/1.3/" + method, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    if status != expect_http:
        fail(f"{method}: HTTP {status}, expected {expect_http}: {text!r}")
    try:
        answer = json.loads(text)
    except ValueError:
        fail(f"{method}: body is not JSON: {text!r}")
    if not isinstance(answer, dict):
        fail(f"{method}: body is not a JSON object: {answer!r}")
    if "base_url" in answer:
        fail(f"{method}: response carries base_url, which would move the SDK: {answer!r}")
    if not isinstance(answer.get("status_code"), int):
        fail(f"{method}: status_code missing or not a number (the SDK would reset its base URL): {answer!r}")
    return answer


def wait_done(dispatch, timeout=30):
    """Polls the native dispatch endpoint until the dispatch has been sent (dispatches run asynchronously and
    resolve their audience when they run, so a stop registered before that would change what they reach)."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        req = urllib.request.Request(base + "/v1/dispatches/" + dispatch,
                                     headers={"Authorization": "Bearer " + server_key})
        with urllib.request.urlopen(req, timeout=20) as response:
            if json.loads(response.read()).get("state") == "done":
                return
        time.sleep(0.02)
    fail(f"dispatch {dispatch} not done after {timeout} s")


def device(method, fields):
    request = {"application": application, "hwid": HWID, "userId": USER, "v": "7.1.3", "device_type": 1}
    request.update(fields)
    answer = call(method, request, token=device_key)
    expected = {"status_code": 200, "status_message": "OK", "response": None}
    if answer != expected:
        fail(f"{method}: {answer!r}, expected exactly {expected!r}")


def server(method, notifications):
    answer = call(method, {"application": application, "auth": server_key, "notifications": notifications})
    if answer.get("status_code") != 200 or answer.get("status_message") != "OK":
        fail(f"{method}: {answer!r}")
    response = answer.get("response")
    if not isinstance(response, dict) or set(response) != {"Messages"}:
        fail(f"{method}: response must be {{'Messages': [...]}}: {answer!r}")
    messages = response["Messages"]
    if not isinstance(messages, list) or len(messages) != len(notifications) or not all(
        isinstance(m, str) and m for m in messages
    ):
        fail(f"{method}: one message code per notification expected: {answer!r}")
    return messages[0]


# The app launches: registerDevice with its push token, then the SDK's push-to-start token.
device("registerDevice", {"push_token": push_token, "language": "en", "timezone": 3600})
device("setActivityPushToStartToken", {"activity_push_to_start_token": start_token})
# Methods the SDK sends that Fanout does not act on are still answered OK.
device("applicationOpen", {})
device("setTags", {"tags": {"team": "acme"}})

# The backend starts match-9 for the user: a push-to-start to that user's token.
start = server(
    "startLiveActivity",
    [{
        "content": "Acme FC - Rivals",
        "title": "Kick-off",
        "live_activity": {
            "event": "start",
            "content-state": {"home": 0, "away": 0},
            "attributes-type": "MatchAttributes",
            "attributes": {"home": "Acme FC", "away": "Rivals"},
        },
        "live_activity_id": ACTIVITY,
        "users": [USER],
    }],
)

# The new activity's token arrives: the SDK's startLiveActivity(token:activityId:) is setActivityToken.
device("setActivityToken", {"activity_token": activity_token, "activity_id": ACTIVITY})
update = server(
    "updateLiveActivity",
    [{"live_activity": {"event": "update", "content-state": {"home": 1, "away": 0}}, "live_activity_id": ACTIVITY}],
)

wait_done(update)

# The user dismisses it: the SDK's stop is setActivityToken with an empty token (and the legacy one leaves it out).
device("setActivityToken", {"activity_token": "", "activity_id": ACTIVITY})
device("setActivityToken", {"activity_id": ACTIVITY})
after_stop = server(
    "updateLiveActivity",
    [{"live_activity": {"event": "update", "content-state": {"home": 2, "away": 0}}, "live_activity_id": ACTIVITY}],
)
end = server(
    "updateLiveActivity",
    [{"live_activity": {"event": "end", "dismissal-date": 0}, "live_activity_id": ACTIVITY}],
)

# The app is deleted: unregisterDevice.
device("unregisterDevice", {})

# Argument errors: HTTP 200, status_code 210, the reason in status_message.
answer = call(
    "startLiveActivity",
    {"application": application, "auth": server_key, "notifications": [{
        "live_activity": {"content-state": {}, "attributes-type": "T", "attributes": {}},
        "live_activity_id": "x", "filter": "Fans"}]},
)
if answer.get("status_code") != 210 or "filter" not in answer.get("status_message", "") or "not supported" not in answer["status_message"]:
    fail(f"filter: expected status_code 210 naming filter as not supported: {answer!r}")
answer = call(
    "updateLiveActivity",
    {"application": application, "auth": server_key, "notifications": [{"live_activity": {"event": "update"}, "live_activity_id": "x"}]},
)
if answer.get("status_code") != 210 or "content-state" not in answer.get("status_message", ""):
    fail(f"missing content-state: expected status_code 210 naming it: {answer!r}")
answer = call("updateLiveActivity", {"application": "NOPE1-00000", "auth": server_key, "notifications": []})
if answer.get("status_code") != 210:
    fail(f"unknown application: expected status_code 210: {answer!r}")
# A wrong server key, and a device key where the server key belongs.
for wrong in ["not-a-key", device_key]:
    answer = call("updateLiveActivity", {"application": application, "auth": wrong, "notifications": []},
                  expect_http=401 if wrong == "not-a-key" else 403)
    if answer.get("status_code") not in (401, 403) or answer.get("response", "missing") is not None:
        fail(f"bad auth: {answer!r}")

print(json.dumps({"start": start, "update": update, "after_stop": after_stop, "end": end}))
