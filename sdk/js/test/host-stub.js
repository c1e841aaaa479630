// Stands in for the host's `promptd:plugin/host@0.3.0` when the SDK runs under Node (test.sh).
export const logged = [];
export function log(level, message) {
  logged.push([level, message]);
}
