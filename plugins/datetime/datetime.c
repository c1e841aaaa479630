/*
 * datetime: the step's date, weekday and time zone, as variables and a runtime context line.
 *
 * The plugin never reads a clock, so that a request is reproducible from its inputs: the client
 * sends the time as step facts.
 *
 * Facts (all optional; a bad value fails every contribution the host asks for, with the same
 * message):
 *   date      `YYYY-MM-DD` (proleptic Gregorian, year 0000-9999).
 *   now       an RFC 3339 timestamp, e.g. `2026-12-01T09:30:00+01:00`, `2026-12-01T08:30:00.25Z`.
 *             Its local date part is the date when `date` is not sent.
 *   locale    the weekday's language, e.g. `fr`, `fr-FR`, `fr_FR` (the language part counts).
 *   timezone  an IANA name such as `Europe/Paris` (characters A-Z a-z 0-9 _ + / - only).
 *
 * Config (strings; any other key refuses the plugin):
 *   locale    default locale when the fact is absent (default `en`); one of de, en, es, fr, it,
 *             ja, nl, pt, zh.
 *   timezone  default time zone when the fact is absent.
 *   order     the context's order (default 10).
 *
 *     [plugins.datetime]
 *     config = { locale = "de", timezone = "Europe/Berlin", order = "10" }
 *
 * Variables (dynamic; all three have no value when neither `date` nor `now` is sent):
 *   {{date}}      the ISO date, e.g. `2026-12-01`.
 *   {{weekday}}   the date's weekday in the locale, e.g. `Tuesday`, `mardi`, `火曜日`.
 *   {{timezone}}  fact `timezone`, else config `timezone`, else the offset of `now` (`+01:00`,
 *                 kept as written; `Z` gives `UTC`), else `UTC`.
 *
 * Context `datetime:now` (dynamic): "Today is {{weekday}}, {{date}} (time zone: {{timezone}})."
 * when a date is known, else "" (no context this step). It returns that template and lets the
 * host interpolate it, so the line always agrees with the variables the rest of the prompt sees,
 * including an agent-scoped variable that shadows one of ours (e.g. a per-agent `timezone`).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "promptd.h"

static const char CONTEXT_TEXT[] = "Today is {{weekday}}, {{date}} (time zone: {{timezone}}).";

typedef struct {
    const char *code;
    const char *weekdays[7]; /* Monday first (ISO 8601) */
} locale;

/* Sorted by code: the error message lists them in this order. */
static const locale LOCALES[] = {
    {"de", {"Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"}},
    {"en", {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}},
    {"es", {"lunes", "martes", "miércoles", "jueves", "viernes", "sábado", "domingo"}},
    {"fr", {"lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche"}},
    {"it", {"lunedì", "martedì", "mercoledì", "giovedì", "venerdì", "sabato", "domenica"}},
    {"ja", {"月曜日", "火曜日", "水曜日", "木曜日", "金曜日", "土曜日", "日曜日"}},
    {"nl", {"maandag", "dinsdag", "woensdag", "donderdag", "vrijdag", "zaterdag", "zondag"}},
    {"pt", {"segunda-feira", "terça-feira", "quarta-feira", "quinta-feira", "sexta-feira",
            "sábado", "domingo"}},
    {"zh", {"星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"}},
};
#define LOCALE_COUNT (sizeof LOCALES / sizeof LOCALES[0])
#define LOCALE_ERROR "is not a supported locale (supported: de, en, es, fr, it, ja, nl, pt, zh)"
#define TIMEZONE_ERROR \
    "is not a time zone name (an IANA name like Europe/Paris; characters A-Z a-z 0-9 _ + / -)"

/* The config, kept for the dynamic calls (the SDK frees the config after declare). */
typedef struct {
    const locale *locale;
    char *timezone; /* NULL: not configured */
} settings;

static settings SETTINGS;

static char ascii_lower(char c) {
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* The locale of a tag like `fr`, `fr-FR` or `FR_fr` (by its language part), or NULL. */
static const locale *find_locale(const char *tag) {
    size_t n = strcspn(tag, "-_");
    for (size_t i = 0; i < LOCALE_COUNT; i++) {
        const char *code = LOCALES[i].code;
        if (strlen(code) != n) continue;
        size_t j = 0;
        while (j < n && ascii_lower(tag[j]) == code[j]) j++;
        if (j == n) return &LOCALES[i];
    }
    return NULL;
}

static bool is_timezone_name(const char *s) {
    static const char ALLOWED[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+/-";
    return *s && s[strspn(s, ALLOWED)] == '\0';
}

/* ---- dates ---- */

typedef struct {
    int year, month, day;
} civil_date;

/* Reads exactly `n` ASCII digits at `s`. */
static bool digits(const char *s, int n, int *value) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *value = v;
    return true;
}

static bool is_leap(int y) {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(int y, int m) {
    static const int DAYS[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap(y) ? 29 : DAYS[m - 1];
}

/* Reads a valid `YYYY-MM-DD` at the start of `s` (10 characters; the caller checks the rest). */
static bool parse_date_prefix(const char *s, civil_date *d) {
    return digits(s, 4, &d->year) && s[4] == '-' && digits(s + 5, 2, &d->month) &&
           s[7] == '-' && digits(s + 8, 2, &d->day) && d->month >= 1 && d->month <= 12 &&
           d->day >= 1 && d->day <= days_in_month(d->year, d->month);
}

static bool parse_date(const char *s, civil_date *d) {
    return strlen(s) == 10 && parse_date_prefix(s, d);
}

/* RFC 3339 date-time (section 5.6): the date and the offset as written (`Z` gives `UTC`).
 * `T` and `Z` may be lower case (as the RFC allows); second 60 is a leap second. */
static bool parse_timestamp(const char *s, civil_date *d, char offset[7]) {
    int hour, minute, second;
    if (strlen(s) < 20 || !parse_date_prefix(s, d) || (s[10] != 'T' && s[10] != 't') ||
        !digits(s + 11, 2, &hour) || s[13] != ':' || !digits(s + 14, 2, &minute) ||
        s[16] != ':' || !digits(s + 17, 2, &second) || hour > 23 || minute > 59 || second > 60)
        return false;
    const char *p = s + 19;
    if (*p == '.') {
        const char *frac = ++p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == frac) return false;
    }
    if ((*p == 'Z' || *p == 'z') && p[1] == '\0') {
        strcpy(offset, "UTC");
        return true;
    }
    int oh, om;
    if ((*p != '+' && *p != '-') || !digits(p + 1, 2, &oh) || p[3] != ':' ||
        !digits(p + 4, 2, &om) || p[6] != '\0' || oh > 23 || om > 59)
        return false;
    memcpy(offset, p, 7); /* `+hh:mm` and its NUL */
    return true;
}

/* Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's days_from_civil). */
static long days_from_civil(int y, int m, int d) {
    y -= m <= 2;
    long era = (y >= 0 ? y : y - 399) / 400;
    long yoe = y - era * 400;
    long doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* 0 = Monday ... 6 = Sunday; 1970-01-01 was a Thursday. */
static int weekday_index(const civil_date *d) {
    long days = days_from_civil(d->year, d->month, d->day);
    return (int)(((days + 3) % 7 + 7) % 7);
}

/* ---- the step's moment ---- */

typedef struct {
    bool known; /* false: neither `date` nor `now` was sent */
    char date[11];
    const char *weekday;
    const char *timezone; /* into the step, the settings, `offset` or a literal */
    char offset[7];
} moment;

/* Reads the step's facts into `m`; on a bad fact, sets the error on `out` and returns false.
 * Every fact sent is checked, even one not needed this time, so a client bug never hides. */
static bool read_moment(const promptd_step *step, const settings *s, moment *m,
                        promptd_out *out) {
    memset(m, 0, sizeof *m);
    const char *locale_tag = promptd_step_fact(step, "locale");
    const locale *loc = s->locale;
    if (locale_tag && !(loc = find_locale(locale_tag))) {
        promptd_out_error(out, "fact `locale`: `%s` " LOCALE_ERROR, locale_tag);
        return false;
    }
    const char *zone = promptd_step_fact(step, "timezone");
    if (zone && !is_timezone_name(zone)) {
        promptd_out_error(out, "fact `timezone`: `%s` " TIMEZONE_ERROR, zone);
        return false;
    }
    civil_date from_date, from_now;
    const char *date = promptd_step_fact(step, "date");
    if (date && !parse_date(date, &from_date)) {
        promptd_out_error(out, "fact `date`: `%s` is not a date (YYYY-MM-DD)", date);
        return false;
    }
    const char *now = promptd_step_fact(step, "now");
    if (now && !parse_timestamp(now, &from_now, m->offset)) {
        promptd_out_error(out,
                          "fact `now`: `%s` is not an RFC 3339 timestamp "
                          "(YYYY-MM-DDThh:mm:ss[.fraction] then Z or +hh:mm/-hh:mm)",
                          now);
        return false;
    }
    if (!date && !now) return true;

    const civil_date *d = date ? &from_date : &from_now;
    m->known = true;
    memcpy(m->date, date ? date : now, 10); /* validated digits: already the ISO form */
    m->weekday = loc->weekdays[weekday_index(d)];
    m->timezone = zone ? zone : s->timezone ? s->timezone : now ? m->offset : "UTC";
    return true;
}

static void context_text(const promptd_step *step, promptd_out *out, void *user) {
    moment m;
    if (read_moment(step, user, &m, out) && m.known) promptd_out_text(out, CONTEXT_TEXT);
}

static void date_value(const promptd_step *step, promptd_out *out, void *user) {
    moment m;
    if (read_moment(step, user, &m, out) && m.known) promptd_out_text(out, m.date);
}

static void weekday_value(const promptd_step *step, promptd_out *out, void *user) {
    moment m;
    if (read_moment(step, user, &m, out) && m.known) promptd_out_text(out, m.weekday);
}

static void timezone_value(const promptd_step *step, promptd_out *out, void *user) {
    moment m;
    if (read_moment(step, user, &m, out) && m.known) promptd_out_text(out, m.timezone);
}

/* ---- declare ---- */

/* The context's order: a whole number in the range of s32 (no blanks, no `+`). */
static bool parse_order(const char *s, int32_t *order) {
    const char *first = *s == '-' ? s + 1 : s;
    if (*first < '0' || *first > '9') return false; /* strtoll would skip blanks */
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < INT32_MIN || v > INT32_MAX) return false;
    *order = (int32_t)v;
    return true;
}

static void declare(const promptd_config *config, promptd_plugin *p) {
    for (size_t i = 0; i < config->len; i++) {
        const char *key = config->entries[i].key;
        if (strcmp(key, "locale") && strcmp(key, "order") && strcmp(key, "timezone")) {
            promptd_fail(p, "config: unknown key `%s` (known keys: locale, order, timezone)", key);
            return;
        }
    }
    const char *locale_tag = promptd_config_get_or(config, "locale", "en");
    const locale *loc = find_locale(locale_tag);
    if (!loc) {
        promptd_fail(p, "config `locale`: `%s` " LOCALE_ERROR, locale_tag);
        return;
    }
    const char *zone = promptd_config_get(config, "timezone");
    if (zone && !is_timezone_name(zone)) {
        promptd_fail(p, "config `timezone`: `%s` " TIMEZONE_ERROR, zone);
        return;
    }
    const char *order_text = promptd_config_get_or(config, "order", "10");
    int32_t order;
    if (!parse_order(order_text, &order)) {
        promptd_fail(p, "config `order`: `%s` is not an order (digits with an optional `-`, 32-bit)",
                     order_text);
        return;
    }

    free(SETTINGS.timezone); /* declare runs again in a fresh instance only, but be tidy */
    SETTINGS.locale = loc;
    SETTINGS.timezone = zone ? strdup(zone) : NULL;

    /* Every dynamic item reads these facts only (world 0.3.0): in a session they are asked
       again only when one changes. Nothing here reads the clock. */
    static const char *const FACTS[] = {"date", "locale", "now", "timezone"};
    promptd_default_reads(p, FACTS, 4, 0, false);
    promptd_dynamic_context(p, "datetime:now", order, context_text, &SETTINGS);
    promptd_dynamic_variable(p, "date", date_value, &SETTINGS);
    promptd_dynamic_variable(p, "weekday", weekday_value, &SETTINGS);
    promptd_dynamic_variable(p, "timezone", timezone_value, &SETTINGS);
}

PROMPTD_EXPORT_PLUGIN(declare)
