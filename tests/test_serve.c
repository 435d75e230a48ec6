/* tlm serve's engine without HTTP: chat templates, request parsing, stop strings, the sampler's
 * penalties and min-p, and the scheduler against tlm_session_generate on the pretrained
 * stories260K. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "serve/serve.h"
#include "tlm.h"

static void test_templates(void) {
    srv_message msgs[] = {{"system", "Be brief.", NULL, NULL},
                          {"user", "Hi", NULL, NULL},
                          {"assistant", "Hello!", NULL, NULL},
                          {"user", "Name a color.", NULL, NULL}};
    struct {
        tlm_chat_template t;
        const char *want;
    } cases[] = {
        {TLM_CHAT_CHATML,
         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
         "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a "
         "color.<|im_end|>\n<|im_start|>assistant\n"},
        {TLM_CHAT_LLAMA3,
         "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
         "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nName "
         "a color.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {TLM_CHAT_LLAMA2,
         "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello!</s><s>[INST] "
         "Name a color. [/INST]"},
        {TLM_CHAT_MISTRAL, "<s>[INST] Be brief.\n\nHi [/INST] Hello!</s><s>[INST] Name a color. "
                           "[/INST]"},
        {TLM_CHAT_GEMMA, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>"
                         "model\nHello!<end_of_turn>\n<start_of_turn>user\nName a color."
                         "<end_of_turn>\n<start_of_turn>model\n"},
        {TLM_CHAT_PHI3, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!"
                        "<|end|>\n<|user|>\nName a color.<|end|>\n<|assistant|>\n"},
        /* Mistral Nemo's template: the system prompt opens the last user message */
        {TLM_CHAT_MISTRAL_NEMO,
         "<s>[INST]Hi[/INST]Hello!</s>[INST]Be brief.\n\nName a color.[/INST]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        CHECK_OK(srv_template_apply(cases[i].t, msgs, 4, &out));
        CHECK(out && !strcmp(out, cases[i].want), "%s renders\n%s",
              tlm_chat_template_name(cases[i].t), out ? out : "(null)");
        free(out);
        /* the assistant turn finetuning trains on: the answer and the turn's end marker */
        tlm_chat_message cm[4];
        for (int k = 0; k < 4; k++) cm[k] = (tlm_chat_message){msgs[k].role, msgs[k].content};
        tlm_chat_span *sp = NULL;
        int ns = 0;
        CHECK_OK(tlm_chat_render(cases[i].t, cm, 4, 0, &out, &sp, &ns));
        const char *end = tlm_chat_template_end(cases[i].t);
        size_t el = strlen(end);
        CHECK(out && ns == 1 && sp[0].msg == 2 && sp[0].end - sp[0].begin >= 6 + el &&
                  !memcmp(out + sp[0].end - el, end, el) &&
                  !memcmp(out + sp[0].end - el - 6, "Hello!", 6),
              "%s: the answer's span", tlm_chat_template_name(cases[i].t));
        free(out);
        free(sp);
        tlm_chat_template back;
        CHECK(tlm_chat_template_from_name(tlm_chat_template_name(cases[i].t), &back) &&
                  back == cases[i].t,
              "name round trip");
    }
    /* Recognition from (abridged) Jinja sources of each family. */
    struct {
        const char *jinja;
        tlm_chat_template want;
    } det[] = {
        {"{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n'}}{% endfor %}",
         TLM_CHAT_CHATML},
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}",
         TLM_CHAT_LLAMA3},
        {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' + content }}", TLM_CHAT_LLAMA2},
        {"{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}",
         TLM_CHAT_MISTRAL},
        {"{{ '<start_of_turn>' + role + '\\n' }}", TLM_CHAT_GEMMA},
        {"{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n'}}", TLM_CHAT_PHI3},
        {"{{- bos_token }}{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + message[\"content\"] + "
         "\"[/INST]\" }}",
         TLM_CHAT_MISTRAL_NEMO},
    };
    for (size_t i = 0; i < sizeof det / sizeof det[0]; i++) {
        tlm_chat_template t = TLM_CHAT_COUNT;
        CHECK(tlm_chat_template_detect(det[i].jinja, &t) && t == det[i].want, "detect case %zu: %d",
              i, (int)t);
    }
    tlm_chat_template t;
    CHECK(!tlm_chat_template_detect("{{ messages }}", &t), "an unknown template is not recognised");
    CHECK(!tlm_chat_template_from_name("vicuna", &t), "unknown name");
}

static int parse_fails(const char *body, int chat, const char *param, int status) {
    srv_request r;
    srv_error e;
    int rc = srv_request_parse(body, strlen(body), chat, &r, &e);
    if (rc == 0) {
        srv_request_free(&r);
        fprintf(stderr, "accepted: %s\n", body);
        return 0;
    }
    if (strcmp(e.param, param) || e.status != status || !e.message[0]) {
        fprintf(stderr, "%s: param '%s' status %d: %s\n", body, e.param, e.status, e.message);
        return 0;
    }
    return 1;
}

static void test_requests(void) {
    srv_request r;
    srv_error e;
    const char *ok = "{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                     "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":"
                     "null}],\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,"
                     "\"min_p\":0.1,\"seed\":42,\"stop\":[\"x\",\"yz\"],\"presence_penalty\":0.5,"
                     "\"frequency_penalty\":-0.5,\"repeat_penalty\":1.1,\"logprobs\":true,"
                     "\"top_logprobs\":2,\"n\":2,\"stream\":true,\"stream_options\":"
                     "{\"include_usage\":true},\"user\":\"unknown fields are ignored\"}";
    CHECK(srv_request_parse(ok, strlen(ok), 1, &r, &e) == 0, "%s", e.message);
    CHECK(r.n_messages == 3 && !strcmp(r.messages[1].content, "ab") &&
              !strcmp(r.messages[2].content, "") && !strcmp(r.messages[0].role, "system"),
          "messages");
    CHECK(r.max_tokens == 7 && r.sampling.temperature == 0.5f && r.sampling.top_p == 0.9f &&
              r.sampling.top_k == 3 && r.sampling.min_p == 0.1f && r.sampling.seed == 42 &&
              r.seed_given,
          "sampling fields");
    CHECK(r.n_stop == 2 && !strcmp(r.stop[1], "yz"), "stop");
    CHECK(r.sampling.presence_penalty == 0.5f && r.sampling.frequency_penalty == -0.5f &&
              r.sampling.repeat_penalty == 1.1f,
          "penalties");
    CHECK(r.logprobs == 1 && r.top_logprobs == 2 && r.n == 2 && r.stream && r.include_usage,
          "flags");
    srv_request_free(&r);

    const char *ids = "{\"prompt\":[1,2,3],\"max_completion_tokens\":4,\"logprobs\":3,"
                      "\"stop\":\"\\n\"}";
    CHECK(srv_request_parse(ids, strlen(ids), 0, &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && !r.prompt && r.max_tokens == 4 &&
              r.logprobs && r.top_logprobs == 3 && r.n_stop == 1 && !strcmp(r.stop[0], "\n"),
          "completion with ids");
    CHECK(r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f && r.sampling.top_k == 0,
          "OpenAI's defaults");
    srv_request_free(&r);

    CHECK(parse_fails("{\"prompt\": \"a\"", 0, "", 400), "truncated JSON");
    CHECK(parse_fails("[1,2]", 0, "", 400), "not an object");
    CHECK(parse_fails("{}", 0, "prompt", 400), "no prompt");
    CHECK(parse_fails("{}", 1, "messages", 400), "no messages");
    CHECK(parse_fails("{\"messages\":[]}", 1, "messages", 400), "empty messages");
    CHECK(
        parse_fails("{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 1, "messages", 400),
        "bad role");
    CHECK(parse_fails("{\"messages\":[{\"role\":\"user\"}]}", 1, "messages", 400), "no content");
    CHECK(parse_fails("{\"prompt\":\"a\",\"max_tokens\":-5}", 0, "max_tokens", 400),
          "negative max_tokens");
    CHECK(parse_fails("{\"prompt\":\"a\",\"max_tokens\":1e300}", 0, "max_tokens", 400),
          "huge max_tokens");
    CHECK(parse_fails("{\"prompt\":\"a\",\"max_tokens\":1.5}", 0, "max_tokens", 400),
          "fractional max_tokens");
    CHECK(parse_fails("{\"prompt\":\"a\",\"max_tokens\":\"9\"}", 0, "max_tokens", 400),
          "string max_tokens");
    CHECK(parse_fails("{\"prompt\":\"a\",\"temperature\":-1}", 0, "temperature", 400),
          "negative temperature");
    CHECK(parse_fails("{\"prompt\":\"a\",\"top_p\":2}", 0, "top_p", 400), "top_p > 1");
    CHECK(parse_fails("{\"prompt\":\"a\",\"n\":0}", 0, "n", 400), "n = 0");
    CHECK(parse_fails("{\"prompt\":\"a\",\"stream\":1}", 0, "stream", 400), "stream not bool");
    CHECK(parse_fails("{\"prompt\":\"a\",\"stop\":[1]}", 0, "stop", 400), "stop not string");
    CHECK(parse_fails("{\"prompt\":[[1],[2]]}", 0, "prompt", 400), "several prompts");
    CHECK(parse_fails("{\"prompt\":[-1]}", 0, "prompt", 400), "negative id");
    CHECK(parse_fails("{\"prompt\":\"\xff\xfe\"}", 0, "prompt", 400), "invalid UTF-8");
    CHECK(parse_fails("{\"prompt\":\"\\ud800\"}", 0, "", 400), "lone surrogate escape");
    CHECK(parse_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}",
                      1, "top_logprobs", 400),
          "top_logprobs without logprobs");
    CHECK(parse_fails("{\"prompt\":\"a\",\"logprobs\":21}", 0, "logprobs", 400),
          "too many logprobs");

    CHECK(srv_utf8_valid("h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10), "valid UTF-8");
    CHECK(!srv_utf8_valid("\xc0\xaf", 2), "overlong");
    CHECK(!srv_utf8_valid("\xed\xa0\x80", 3), "surrogate");
    CHECK(!srv_utf8_valid("\xe2\x82", 2), "truncated");
    CHECK(!srv_utf8_valid("\xf4\x90\x80\x80", 4), "past U+10FFFF");
}

static void test_stop_scan(void) {
    char *stops[] = {"END", "\n\n"};
    int hit;
    size_t n = srv_stop_scan("abcEN", 5, stops, 2, &hit);
    CHECK(n == 3 && !hit, "holds back a partial stop: %zu", n);
    n = srv_stop_scan("abcENDxyz", 9, stops, 2, &hit);
    CHECK(n == 3 && hit, "cuts at the stop: %zu", n);
    n = srv_stop_scan("a\n\nbEND", 7, stops, 2, &hit);
    CHECK(n == 1 && hit == 2, "the first stop wins, named by its index + 1: %zu, %d", n, hit);
    n = srv_stop_scan("abc\n", 4, stops, 2, &hit);
    CHECK(n == 3 && !hit, "newline held: %zu", n);
    n = srv_stop_scan("abcE", 4, NULL, 0, &hit);
    CHECK(n == 4 && !hit, "no stops: everything");
}

static void test_sampler_extras(void) {
    tlm_sampler *s = NULL;
    float l[5] = {0, 0, 0, 2.0f, 1.5f};
    int32_t id = -1;
    tlm_sampler_opts o = {.temperature = 0, .top_p = 1, .repeat_penalty = 2};
    CHECK_OK(tlm_sampler_new(&o, 5, &s));
    CHECK_OK(tlm_sampler_sample(s, l, &id));
    CHECK(id == 3, "greedy before any penalty: %d", id);
    tlm_sampler_accept(s, 3);
    CHECK_OK(tlm_sampler_sample(s, l, &id));
    CHECK(id == 4, "2.0 / 2 falls below 1.5: %d", id);
    tlm_sampler_free(s);

    float l2[2] = {1.0f, 0.9f};
    o = (tlm_sampler_opts){.temperature = 0, .top_p = 1, .frequency_penalty = 0.06f};
    CHECK_OK(tlm_sampler_new(&o, 2, &s));
    tlm_sampler_accept(s, 0);
    CHECK_OK(tlm_sampler_sample(s, l2, &id));
    CHECK(id == 0, "one occurrence: 0.94 > 0.9: %d", id);
    tlm_sampler_accept(s, 0);
    CHECK_OK(tlm_sampler_sample(s, l2, &id));
    CHECK(id == 1, "two occurrences: 0.88 < 0.9: %d", id);
    tlm_sampler_free(s);

    o = (tlm_sampler_opts){
        .temperature = 0, .top_p = 1, .presence_penalty = 0.2f, .penalty_last_n = 2};
    CHECK_OK(tlm_sampler_new(&o, 2, &s));
    tlm_sampler_accept(s, 0);
    CHECK_OK(tlm_sampler_sample(s, l2, &id));
    CHECK(id == 1, "presence: %d", id);
    tlm_sampler_accept(s, 1);
    tlm_sampler_accept(s, 1); /* id 0 leaves the window of 2 */
    CHECK_OK(tlm_sampler_sample(s, l2, &id));
    CHECK(id == 0, "id 0 out of the window, id 1 penalized: %d", id);
    tlm_sampler_free(s);

    /* min_p 0.5 at temperature 1: weights 1, e^-0.5 = 0.61, e^-1 = 0.37: id 2 is never drawn. */
    float l3[3] = {0, -0.5f, -1.0f};
    o = (tlm_sampler_opts){.temperature = 1, .top_p = 1, .min_p = 0.5f, .seed = 7};
    CHECK_OK(tlm_sampler_new(&o, 3, &s));
    int count[3] = {0};
    for (int i = 0; i < 3000; i++) {
        CHECK_OK(tlm_sampler_sample(s, l3, &id));
        if (id >= 0 && id < 3) count[id]++;
    }
    CHECK(count[2] == 0 && count[1] > 900 && count[1] < 1400, "min_p counts %d %d %d", count[0],
          count[1], count[2]);
    tlm_sampler_free(s);
    o.min_p = 1.5f;
    CHECK(tlm_sampler_new(&o, 3, &s) == TLM_ERR_ARG, "min_p > 1 refused");
}

/* The greedy continuation of one sequence alone (prefill, then one decode step per token), as
 * text decoded in context: what every scheduled job must reproduce. */
/* One sequence alone: greedy (o NULL) or sampled with o, the prompt and every new id accepted by
 * the sampler as tlm_session_generate does. */
static char *reference_sampled(const tlm_model *m, const tlm_tokenizer *tok, const int32_t *ids,
                               int n, int n_new, const tlm_sampler_opts *o);
static char *reference_text(const tlm_model *m, const tlm_tokenizer *tok, const int32_t *ids, int n,
                            int n_new) {
    return reference_sampled(m, tok, ids, n, n_new, NULL);
}
static char *reference_sampled(const tlm_model *m, const tlm_tokenizer *tok, const int32_t *ids,
                               int n, int n_new, const tlm_sampler_opts *o) {
    int V = tlm_model_config(m)->vocab_size;
    int32_t eos = tlm_tokenizer_eos(tok), out[256];
    int n_out = 0;
    tlm_session *s = NULL;
    float *logits = malloc((size_t)V * sizeof(float));
    char *text = calloc(4096, 1);
    tlm_decoder *d = NULL;
    tlm_sampler *samp = NULL;
    if (!logits || !text || n_new > 256 || tlm_session_new(m, NULL, &s) ||
        tlm_session_prefill(s, 0, ids, n, logits, 0) ||
        tlm_decoder_new(tok, TLM_DECODE_SKIP_SPECIAL, &d) || (o && tlm_sampler_new(o, V, &samp))) {
        free(text);
        text = NULL;
        goto done;
    }
    for (int i = 0; samp && i < n; i++) tlm_sampler_accept(samp, ids[i]);
    for (int i = 0; i < n_new; i++) {
        int32_t best = 0;
        if (samp) {
            if (tlm_sampler_sample(samp, logits, &best)) break;
            tlm_sampler_accept(samp, best);
        } else {
            for (int32_t v = 1; v < V; v++)
                if (logits[v] > logits[best]) best = v;
        }
        if (best == eos) break;
        out[n_out++] = best;
        if (tlm_session_decode_one(s, best, logits)) break;
    }
    const char *b;
    size_t bl, len = 0;
    for (int i = 0; i < n; i++) tlm_decoder_push(d, ids[i], &b, &bl);
    tlm_decoder_flush(d, &b, &bl);
    for (int i = 0; i < n_out; i++) {
        tlm_decoder_push(d, out[i], &b, &bl);
        if (len + bl < 4096) memcpy(text + len, b, bl);
        len += bl;
    }
    tlm_decoder_flush(d, &b, &bl);
    if (len + bl < 4096) memcpy(text + len, b, bl);
done:
    tlm_sampler_free(samp);
    tlm_decoder_free(d);
    free(logits);
    tlm_session_free(s);
    return text;
}

static void wait_done(srv_sched *s, srv_job *const *jobs, int n) {
    srv_sched_lock(s);
    for (;;) {
        int done = 1;
        for (int i = 0; i < n; i++) done &= jobs[i]->done;
        if (done) break;
        srv_sched_wait(s, 50);
    }
    srv_sched_unlock(s);
}

static srv_job *greedy_job(const int32_t *ids, int n, int max_tokens) {
    srv_job *j = srv_job_new(ids, n);
    j->max_tokens = max_tokens;
    j->sampling = (tlm_sampler_opts){.temperature = 0, .top_p = 1};
    return j;
}

/* stories260K and its tokenizer from the shared data; 0 (nothing loaded) without them. */
static int load_stories(tlm_model **m, tlm_tokenizer **tok) {
    const char *data = t_require_shared_data();
    if (!data) return 0;
    CHECK_OK(tlm_model_load(t_path(data, "models/stories260K.bin"), 0, m));
    CHECK_OK(tlm_tokenizer_load(t_path(data, "models/tok512.bin"), tok));
    if (*m && *tok) return 1;
    tlm_model_free(*m);
    tlm_tokenizer_free(*tok);
    return 0;
}

static void test_scheduler(void) {
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    if (!load_stories(&m, &tok)) return;
    const char *prompts[] = {"Once upon a time", "The cat sat", "Lily and Ben went to the park",
                             "One day"};
    int32_t *ids[4];
    size_t n_ids[4];
    char *want[4];
    for (int i = 0; i < 4; i++) {
        CHECK_OK(tlm_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), TLM_ENCODE_ADD_BOS,
                                      &ids[i], &n_ids[i]));
        want[i] = reference_text(m, tok, ids[i], (int)n_ids[i], 40);
    }
    srv_sched *s = NULL;
    srv_sched_opts so = {.parallel = 3, .ctx = 256, .queue_max = 2, .prefill_chunk = 3};
    CHECK_OK(srv_sched_new(m, tok, &so, &s));
    if (!s) return;

    /* Four jobs on three slots (one waits in the queue), prompts prefilled in chunks of 3 while
     * the others decode: each text is exactly the one-sequence greedy continuation. */
    srv_job *jobs[4];
    for (int i = 0; i < 4; i++) jobs[i] = greedy_job(ids[i], (int)n_ids[i], 40);
    CHECK_OK(srv_sched_submit(s, jobs, 4));
    wait_done(s, jobs, 4);
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i]->finish == SRV_FINISH_LENGTH && jobs[i]->completion_tokens == 40,
              "job %d: finish %d after %d tokens", i, jobs[i]->finish, jobs[i]->completion_tokens);
        CHECK(jobs[i]->text && want[i] && !strcmp(jobs[i]->text, want[i]),
              "job %d batched:\n%s\nalone:\n%s", i, jobs[i]->text ? jobs[i]->text : "",
              want[i] ? want[i] : "");
        srv_sched_release(s, jobs[i]);
        srv_job_free(jobs[i]);
    }

    /* Penalties count each id once, as for one sequence alone (tlm_session_generate's rules):
     * greedy with a frequency and a presence penalty over a window of 16 ids. */
    tlm_sampler_opts po = {.temperature = 0,
                           .top_p = 1,
                           .frequency_penalty = 0.4f,
                           .presence_penalty = 0.2f,
                           .penalty_last_n = 16};
    char *pen = reference_sampled(m, tok, ids[1], (int)n_ids[1], 40, &po);
    srv_job *pj[2];
    for (int i = 0; i < 2; i++) {
        pj[i] = greedy_job(ids[i], (int)n_ids[i], 40);
        pj[i]->sampling = po;
    }
    CHECK_OK(srv_sched_submit(s, pj, 2));
    wait_done(s, pj, 2);
    CHECK(pen && pj[1]->text && !strcmp(pj[1]->text, pen), "penalized batched:\n%s\nalone:\n%s",
          pj[1]->text ? pj[1]->text : "", pen ? pen : "");
    CHECK(pen && want[1] && strcmp(pen, want[1]), "the penalties change the greedy text");
    for (int i = 0; i < 2; i++) {
        srv_sched_release(s, pj[i]);
        srv_job_free(pj[i]);
    }
    free(pen);

    /* The next turn: the last prompt plus its answer plus more text reuses the cached prefix (the
     * last job admitted still holds its slot's cache). */
    int32_t *turn = NULL;
    size_t n_turn = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s and", prompts[3], want[3]);
    CHECK_OK(tlm_tokenizer_encode(tok, buf, strlen(buf), TLM_ENCODE_ADD_BOS, &turn, &n_turn));
    srv_job *j = greedy_job(turn, (int)n_turn, 5);
    CHECK_OK(srv_sched_submit(s, &j, 1));
    wait_done(s, &j, 1);
    CHECK(j->cached_tokens >= (int)n_ids[3] + 20 && j->cached_tokens < (int)n_turn,
          "cached %d of %zu (first turn %zu)", j->cached_tokens, n_turn, n_ids[3]);
    char *again = reference_text(m, tok, turn, (int)n_turn, 5);
    CHECK(again && j->text && !strcmp(j->text, again), "reused cache gives\n%s\nnot\n%s",
          j->text ? j->text : "", again ? again : "");
    free(again);
    srv_sched_release(s, j);
    srv_job_free(j);
    free(turn);

    /* A stop string cuts the text exactly before it, even when it spans tokens. */
    const char *cut = strstr(want[0], "little");
    if (cut) {
        char *stops[] = {"little"};
        j = greedy_job(ids[0], (int)n_ids[0], 40);
        j->stop = stops;
        j->n_stop = 1;
        CHECK_OK(srv_sched_submit(s, &j, 1));
        wait_done(s, &j, 1);
        CHECK(j->finish == SRV_FINISH_STOP && j->text_len == (size_t)(cut - want[0]) &&
                  !memcmp(j->text, want[0], j->text_len),
              "stop: '%s'", j->text ? j->text : "");
        srv_sched_release(s, j);
        srv_job_free(j);
    }

    /* max_tokens 0: the prompt is read (and cached), nothing is generated. */
    j = greedy_job(ids[2], (int)n_ids[2], 0);
    CHECK_OK(srv_sched_submit(s, &j, 1));
    wait_done(s, &j, 1);
    CHECK(j->finish == SRV_FINISH_LENGTH && j->completion_tokens == 0 && j->text_len == 0,
          "max_tokens 0: %d tokens", j->completion_tokens);
    srv_sched_release(s, j);
    srv_job_free(j);

    /* Logprobs: the greedy token is the top alternative, and probabilities are <= 1. */
    j = greedy_job(ids[1], (int)n_ids[1], 4);
    j->logprobs = 1;
    j->top_logprobs = 3;
    CHECK_OK(srv_sched_submit(s, &j, 1));
    wait_done(s, &j, 1);
    CHECK(j->n_lps == 4, "%d logprobs", j->n_lps);
    for (int t = 0; t < j->n_lps; t++) {
        const srv_token_lp *x = &j->lps[t];
        CHECK(x->n_top == 3 && x->top_id[0] == x->id && x->logprob <= 0 &&
                  fabsf(x->top_lp[0] - x->logprob) < 1e-6f && x->top_lp[1] <= x->top_lp[0] &&
                  x->top_lp[2] <= x->top_lp[1],
              "token %d logprobs", t);
    }
    srv_sched_release(s, j);
    srv_job_free(j);

    /* Cancelling frees the slot; a full queue refuses. */
    srv_job *many[6];
    for (int i = 0; i < 6; i++) many[i] = greedy_job(ids[0], (int)n_ids[0], 200);
    CHECK_OK(srv_sched_submit(s, many, 5));
    CHECK(srv_sched_submit(s, many + 5, 1) == TLM_ERR_RANGE, "3 slots + 2 queued: the 6th waits");
    for (int i = 0; i < 5; i++) {
        srv_sched_release(s, many[i]);
        CHECK(many[i]->done, "released job %d is done", i);
    }
    srv_stats st;
    srv_sched_stats(s, &st);
    CHECK(st.busy == 0 && st.queued == 0, "idle after cancelling: %d busy, %d queued", st.busy,
          st.queued);
    CHECK_OK(srv_sched_submit(s, many + 5, 1));
    srv_sched_release(s, many[5]);
    for (int i = 0; i < 6; i++) srv_job_free(many[i]);

    /* Prompts that cannot run are refused before queueing. */
    int32_t big = 100000;
    j = srv_job_new(&big, 1);
    CHECK(srv_sched_submit(s, &j, 1) == TLM_ERR_RANGE, "id outside the vocabulary");
    srv_job_free(j);
    srv_sched_close(s);
    j = greedy_job(ids[0], (int)n_ids[0], 1);
    CHECK(srv_sched_submit(s, &j, 1) == TLM_ERR_INTERRUPTED, "closed");
    srv_job_free(j);

    srv_sched_free(s);
    for (int i = 0; i < 4; i++) {
        free(ids[i]);
        free(want[i]);
    }
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
}

/* One job to the end; its text (the caller frees the job). */
static srv_job *run_one(srv_sched *s, const int32_t *ids, int n, int max_tokens) {
    srv_job *j = greedy_job(ids, n, max_tokens);
    CHECK_OK(srv_sched_submit(s, &j, 1));
    wait_done(s, &j, 1);
    srv_sched_release(s, j);
    return j;
}

/* The prompt cache: one slot, a first turn, another conversation taking the slot over, then the
 * first conversation's next turn, which continues from the prefix the cache kept (and gives the
 * same text as a fresh prefill). Without the cache, the next turn starts over. */
static void test_prompt_cache(void) {
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    if (!load_stories(&m, &tok)) return;
    const char *first = "Lily and Ben went to the park with their mom and dad to play";
    int32_t *a = NULL, *b = NULL, *next = NULL;
    size_t na = 0, nb = 0, nn = 0;
    CHECK_OK(tlm_tokenizer_encode(tok, first, strlen(first), TLM_ENCODE_ADD_BOS, &a, &na));
    CHECK_OK(tlm_tokenizer_encode(tok, "Tom", 3, TLM_ENCODE_ADD_BOS, &b, &nb));
    char *answer = reference_text(m, tok, a, (int)na, 30);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s and", first, answer ? answer : "");
    CHECK_OK(tlm_tokenizer_encode(tok, buf, strlen(buf), TLM_ENCODE_ADD_BOS, &next, &nn));
    char *want = reference_text(m, tok, next, (int)nn, 8);
    for (int mib = 0; mib <= 64; mib += 64) {
        srv_sched *s = NULL;
        srv_sched_opts so = {.parallel = 1, .ctx = 256, .cache_mib = mib};
        CHECK_OK(srv_sched_new(m, tok, &so, &s));
        if (!s) break;
        srv_job *j1 = run_one(s, a, (int)na, 30), *j2 = run_one(s, b, (int)nb, 30);
        srv_job *j3 = run_one(s, next, (int)nn, 8);
        CHECK(j1->text && answer && !strcmp(j1->text, answer), "first turn as alone");
        CHECK(j2->cached_tokens <= 1, "another conversation reuses %d tokens", j2->cached_tokens);
        srv_stats st;
        srv_sched_stats(s, &st);
        if (mib) {
            CHECK(j3->cached_tokens >= (int)na + 20 && j3->cached_tokens < (int)nn,
                  "next turn from the prompt cache: %d of %zu cached (first turn %zu)",
                  j3->cached_tokens, nn, na);
            CHECK(st.cache_hits == 1 && st.cache_entries >= 1 && st.cache_bytes > 0,
                  "cache stats: %llu hits, %d entries, %zu bytes",
                  (unsigned long long)st.cache_hits, st.cache_entries, st.cache_bytes);
        } else {
            CHECK(j3->cached_tokens <= 1, "no cache: %d cached", j3->cached_tokens);
            CHECK(st.cache_hits == 0 && st.cache_entries == 0, "no cache, no entries");
        }
        CHECK(j3->text && want && !strcmp(j3->text, want),
              "next turn (cache %d MiB) gives\n%s\nnot\n%s", mib, j3->text ? j3->text : "",
              want ? want : "");
        srv_job_free(j1);
        srv_job_free(j2);
        srv_job_free(j3);
        srv_sched_free(s);
    }
    free(answer);
    free(want);
    free(a);
    free(b);
    free(next);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
}

/* A model whose layers all have a sliding window of 16, served with rings of 27 positions
 * (step_max 12) over slots of 256: the text of each turn is a full cache's under the same window.
 * A next turn continues from the slot (its prompt differs from what the slot holds in its last
 * ten or so positions: a cut the ring allows); a prompt sharing only an early prefix finds it
 * overwritten in the ring and starts over; the prompt cache, unable to save what the ring
 * overwrote, keeps nothing. */
static void test_ring(void) {
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    if (!load_stories(&m, &tok)) return;
    /* the windows are read at each pass, so setting them on the loaded model windows it */
    tlm_config *c = (tlm_config *)tlm_model_config(m);
    c->sliding_window = 16;
    c->sliding_window_pattern = 0;
    const char *first = "Lily and Ben went to the park with their mom and dad to play";
    int32_t *a = NULL, *b = NULL, *next = NULL;
    size_t na = 0, nb = 0, nn = 0;
    CHECK_OK(tlm_tokenizer_encode(tok, first, strlen(first), TLM_ENCODE_ADD_BOS, &a, &na));
    CHECK_OK(tlm_tokenizer_encode(tok, "Tom", 3, TLM_ENCODE_ADD_BOS, &b, &nb));
    char *answer = reference_text(m, tok, a, (int)na, 30);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s and", first, answer ? answer : "");
    CHECK_OK(tlm_tokenizer_encode(tok, buf, strlen(buf), TLM_ENCODE_ADD_BOS, &next, &nn));
    char *want = reference_text(m, tok, next, (int)nn, 8);
    int32_t early[64];
    int ne = 0;
    for (size_t i = 0; i < 6 && i < na; i++) early[ne++] = a[i];
    for (size_t i = 1; i < nb; i++) early[ne++] = b[i];
    char *want_early = reference_text(m, tok, early, ne, 8);
    srv_sched *s = NULL, *full = NULL;
    srv_sched_opts so = {.parallel = 1, .ctx = 256, .prefill_chunk = 3, .cache_mib = 64};
    CHECK_OK(srv_sched_new(m, tok, &so, &full));
    so.step_max = 12;
    CHECK_OK(srv_sched_new(m, tok, &so, &s));
    if (s && full) {
        /* rows per cached head: the ring of 27 and a mirror of 15 + 11, against 256 */
        CHECK(srv_sched_kv_bytes(s) * 256 == srv_sched_kv_bytes(full) * 53,
              "ring cache %zu bytes, full %zu", srv_sched_kv_bytes(s), srv_sched_kv_bytes(full));
        srv_job *j1 = run_one(s, a, (int)na, 30);
        CHECK(j1->text && answer && !strcmp(j1->text, answer), "first turn with rings");
        srv_job *j3 = run_one(s, next, (int)nn, 8);
        CHECK(j3->cached_tokens >= (int)na + 15, "next turn from the slot: %d cached",
              j3->cached_tokens);
        CHECK(j3->text && want && !strcmp(j3->text, want),
              "next turn with rings gives\n%s\nnot\n%s", j3->text ? j3->text : "",
              want ? want : "");
        srv_job *j4 = run_one(s, early, ne, 8);
        CHECK(j4->cached_tokens == 0, "an overwritten prefix reused: %d cached", j4->cached_tokens);
        CHECK(j4->text && want_early && !strcmp(j4->text, want_early), "early prefix's text");
        srv_job *j2 = run_one(s, b, (int)nb, 30);
        srv_stats st;
        srv_sched_stats(s, &st);
        CHECK(st.cache_entries == 0 && st.cache_hits == 0, "prompt cache: %d entries, %llu hits",
              st.cache_entries, (unsigned long long)st.cache_hits);
        srv_job_free(j1);
        srv_job_free(j2);
        srv_job_free(j3);
        srv_job_free(j4);
    }
    srv_sched_free(s);
    srv_sched_free(full);
    free(answer);
    free(want);
    free(want_early);
    free(a);
    free(b);
    free(next);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
}

static void set_text(srv_job *j, const char *t) {
    free(j->text);
    j->text = strdup(t);
    j->text_len = strlen(t);
}

static void test_responses(void) {
    srv_request req = {.chat = 1, .n = 1, .stream = 1, .include_usage = 1};
    int32_t ids[5] = {1, 2, 3, 4, 5};
    srv_job *j = srv_job_new(ids, 5);
    j->cached_tokens = 3;
    srv_response r;
    CHECK(srv_response_init(&r, NULL, "m.gguf", &req, &j, 1, "chatcmpl-1", 42) == 0, "init");

    /* Streamed: the first chunk carries the role, then only new text, then the finish reason, the
     * usage chunk, [DONE]. */
    set_text(j, "He");
    j->completion_tokens = 1;
    CHECK(srv_response_stream(&r) == 0, "not finished");
    set_text(j, "Hello \xff");
    j->completion_tokens = 3;
    j->done = 1;
    j->finish = SRV_FINISH_STOP;
    CHECK(srv_response_stream(&r) == 0, "the finish reason goes in a chunk of its own");
    CHECK(srv_response_stream(&r) == 1, "finished");
    const char *want[] = {
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":42,\"model\":"
        "\"m.gguf\",\"system_fingerprint\":\"tlm-" TLM_VERSION "\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"role\":\"assistant\",\"content\":\"He\"},\"logprobs\":null,"
        "\"finish_reason\":null}]}",
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"llo \xef\xbf\xbd\"},\"logprobs\":null,"
        "\"finish_reason\":null}]}",
        "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}",
        "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,"
        "\"prompt_tokens_details\":{\"cached_tokens\":3}}}",
    };
    char *events = strndup(r.out, r.out_len);
    char *p = events;
    for (size_t e = 0; e < sizeof want / sizeof want[0]; e++) {
        char *end = strstr(p, "\n\n");
        CHECK(end && !strncmp(p, "data: {", 7), "event %zu framing", e);
        if (!end) break;
        *end = 0;
        CHECK(strstr(p, want[e]) && (e == 0 || !strcmp(p + strlen(p) - strlen(want[e]), want[e])),
              "event %zu:\n%s\nwants\n%s", e, p, want[e]);
        p = end + 2;
    }
    CHECK(!strcmp(p, "data: [DONE]\n\n"), "then [DONE]: '%s'", p);
    free(events);

    /* The whole answer. */
    char *final = srv_response_final(&r);
    cJSON *o = cJSON_Parse(final);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItem(ch, "message");
    const cJSON *usage = cJSON_GetObjectItem(o, "usage");
    CHECK(o && !strcmp(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion") &&
              !strcmp(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant") &&
              !strcmp(cJSON_GetObjectItem(msg, "content")->valuestring, "Hello \xef\xbf\xbd") &&
              !strcmp(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop") &&
              cJSON_GetObjectItem(usage, "total_tokens")->valueint == 8,
          "final: %s", final);
    cJSON_Delete(o);
    free(final);
    srv_response_free(&r);

    /* Completions with echo: the prompt text starts the choice. */
    srv_request creq = {.chat = 0, .n = 1, .echo = 1, .prompt = "Once"};
    j->finish = SRV_FINISH_LENGTH;
    CHECK(srv_response_init(&r, NULL, "m", &creq, &j, 1, "cmpl-2", 1) == 0, "init");
    final = srv_response_final(&r);
    CHECK(final && strstr(final, "\"object\":\"text_completion\"") &&
              strstr(final, "\"text\":\"OnceHello \xef\xbf\xbd\"") &&
              strstr(final, "\"finish_reason\":\"length\""),
          "completion: %s", final);
    free(final);
    srv_response_free(&r);
    creq.stream = 1;
    CHECK(srv_response_init(&r, NULL, "m", &creq, &j, 1, "cmpl-3", 1) == 0, "init");
    CHECK(srv_response_stream(&r) == 0, "text first");
    CHECK(r.out && strstr(r.out, "\"text\":\"OnceHello \xef\xbf\xbd\",\"logprobs\":null,"
                                 "\"finish_reason\":null"),
          "streamed echo: %.*s", (int)r.out_len, r.out ? r.out : "");
    srv_response_free(&r);
    srv_job_free(j);

    char *err = srv_error_json(429, NULL, "the queue is full");
    CHECK(err && !strcmp(err, "{\"error\":{\"message\":\"the queue is full\",\"type\":"
                              "\"rate_limit_error\",\"param\":null,\"code\":null}}"),
          "%s", err);
    free(err);
    err = srv_error_json(400, "top_p", "bad");
    CHECK(err && strstr(err, "\"type\":\"invalid_request_error\",\"param\":\"top_p\""), "%s", err);
    free(err);
    char *fixed = srv_utf8_fix("a\xff\xc3\xa9\xe2\x82", 6);
    CHECK(fixed && !strcmp(fixed, "a\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd"), "utf8_fix");
    free(fixed);
}

/* The scheduler's session takes the options' cache types, keys' and values' apart, and a type the
 * model's head size refuses fails srv_sched_new with the session's reason. */
static void test_cache_types(void) {
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    if (!load_stories(&m, &tok)) return;
    srv_sched *s = NULL;
    srv_sched_opts so = {
        .parallel = 2, .ctx = 64, .kv_type = TLM_DTYPE_F16, .v_type = TLM_DTYPE_F32};
    CHECK_OK(srv_sched_new(m, tok, &so, &s));
    if (s) {
        CHECK(srv_sched_kv_type(s) == TLM_DTYPE_F16 && srv_sched_v_type(s) == TLM_DTYPE_F32,
              "cache types %d %d", (int)srv_sched_kv_type(s), (int)srv_sched_v_type(s));
        srv_sched_free(s);
    }
    s = NULL;
    so.v_type = TLM_DTYPE_Q8_0; /* stories260K's head size is 8 */
    CHECK(srv_sched_new(m, tok, &so, &s) != TLM_OK && s == NULL, "Q8_0 values refused");
    CHECK(strstr(tlm_last_error(), "multiple of 32") != NULL, "reason: %s", tlm_last_error());
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
}

/* Tool calls: the Hermes rendering of tools, calls and results; calls parsed out of text (broken
 * ones left as text); the grammar of a required call; requests refused. */
static void test_tools(void) {
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"W?\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"c1\",\"content\":\"21\"},{\"role\":\"tool\",\"content\":\"22\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}}}],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}";
    srv_request r;
    srv_error e;
    CHECK(srv_request_parse(body, strlen(body), SRV_CHAT, &r, &e) == 0, "tools request: %s",
          e.message);
    CHECK(r.n_tools == 1 && r.tool_choice == SRV_TOOLS_REQUIRED && !r.parallel_tools &&
              r.grammar != NULL,
          "tools parsed (%d tools, choice %d)", r.n_tools, r.tool_choice);
    srv_message *m = NULL;
    int n = 0;
    CHECK(srv_tools_messages(&r, &m, &n, &e) == 0 && n == 4, "tool messages: %d", n);
    if (n == 4) {
        CHECK(!strcmp(m[0].role, "system") &&
                  strstr(m[0].content, "<tools>\n{\"type\":"
                                       "\"function\",\"function\":"
                                       "{\"name\":\"w\"") &&
                  strstr(m[0].content, "</tools>"),
              "the tools in a system message: %s", m[0].content);
        CHECK(!strcmp(m[2].role, "assistant") &&
                  !strcmp(m[2].content, "<tool_call>\n{\"name\":\"w\",\"arguments\":"
                                        "{\"city\":\"P\"}}\n</tool_call>"),
              "a call as the model writes it: %s", m[2].content);
        CHECK(!strcmp(m[3].role, "user") &&
                  !strcmp(m[3].content, "<tool_response>\n21\n</tool_response>\n<tool_response>"
                                        "\n22\n</tool_response>"),
              "two results in one user turn: %s", m[3].content);
    }
    srv_messages_free(m, n);
    /* the grammar takes a call of w with its arguments, and nothing else */
    tlm_tokenizer *tok = NULL;
    tlm_grammar_vocab *v = NULL;
    tlm_grammar_state *st = NULL;
    char alphabet[96];
    int k = 0;
    for (int ch = 32; ch < 127; ch++) alphabet[k++] = (char)ch;
    alphabet[k++] = '\n';
    CHECK_OK(tlm_tokenizer_new_char(alphabet, (size_t)k, &tok));
    CHECK_OK(tlm_grammar_vocab_new(tok, tlm_tokenizer_vocab_size(tok), &v));
    CHECK_OK(tlm_grammar_state_new(r.grammar, v, &st));
    const char *good = "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                       "</tool_call>";
    CHECK(!tlm_grammar_state_accept_bytes(st, good, strlen(good)) && tlm_grammar_state_complete(st),
          "the grammar takes a call of w");
    tlm_grammar_state_reset(st);
    const char *bad = "<tool_call>\n{\"name\": \"x\"";
    CHECK(tlm_grammar_state_accept_bytes(st, bad, strlen(bad)) != TLM_OK,
          "the grammar refuses a function the tools lack");
    tlm_grammar_state_free(st);
    tlm_grammar_vocab_free(v);
    tlm_tokenizer_free(tok);
    srv_request_free(&r);

    srv_tool_parse p;
    const char *text = "Let me look. <tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": "
                       "\"P\"}}\n</tool_call>\n<tool_call>{\"name\":\"a\",\"arguments\":\"{}\"}"
                       "</tool_call>";
    CHECK(srv_tools_parse(text, strlen(text), 7, &p) == 0 && p.n_calls == 2 && p.content &&
              !strcmp(p.content, "Let me look.") && p.calls &&
              strstr(p.calls, "\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\"") &&
              strstr(p.calls, "\"name\":\"a\",\"arguments\":\"{}\""),
          "two calls and the text before them: %s / %s", p.content ? p.content : "(null)",
          p.calls ? p.calls : "(null)");
    srv_tool_parse_free(&p);
    const char *broken[] = {"<tool_call>\n{\"name\": \"w\", \"argu",
                            "<tool_call>not json</tool_call>",
                            "<tool_call>{\"arguments\": {}}</tool_call>", "plain text", ""};
    for (int i = 0; i < 5; i++) {
        CHECK(srv_tools_parse(broken[i], strlen(broken[i]), 1, &p) == 0 && p.n_calls == 0 &&
                  !p.calls,
              "broken call %d parsed as a call", i);
        CHECK(i == 4 ? !p.content : p.content && !strcmp(p.content, broken[i]),
              "broken call %d kept as text: %s", i, p.content ? p.content : "(null)");
        srv_tool_parse_free(&p);
    }
    CHECK(parse_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":"
                      "\"function\",\"function\":{\"name\":\"a b\"}}]}",
                      SRV_CHAT, "tools", 400),
          "a function name with a space");
    CHECK(parse_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":"
                      "\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":{\"type\":"
                      "\"function\",\"function\":{\"name\":\"b\"}}}",
                      SRV_CHAT, "tool_choice", 400),
          "a tool_choice naming no tool");
    CHECK(parse_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tool_choice\":"
                      "\"required\"}",
                      SRV_CHAT, "tool_choice", 400),
          "tool_choice without tools");
    CHECK(
        parse_fails("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":"
                    "\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"string\","
                    "\"format\":\"email\"}}}],\"tool_choice\":\"required\"}",
                    SRV_CHAT, "tools", 400),
        "a parameters schema the grammar cannot follow");
}

/* Embeddings: request shapes and refusals, pooling, llama.cpp's normalizations, both answers'
 * JSON (base64 of known floats), and the scheduler's hidden rows against a session's own. */
static void test_embeddings(void) {
    srv_embed_request r;
    srv_error e;
    const char *b = "{\"input\": [\"a\", [1, 2, 3], \"\"], \"model\": \"x\", \"encoding_format\": "
                    "\"base64\", \"embd_normalize\": 1}";
    CHECK(srv_embed_parse(b, strlen(b), 1, 2, &r, &e) == 0, "%s", e.message);
    CHECK(r.oai && r.n_inputs == 3 && r.base64 && r.normalize == 1 && r.model &&
              !strcmp(r.model, "x"),
          "parsed fields");
    CHECK(r.n_inputs == 3 && r.inputs[0].text && !strcmp(r.inputs[0].text, "a") &&
              r.inputs[1].n_ids == 3 && r.inputs[1].ids[2] == 3 && r.inputs[2].text &&
              !r.inputs[2].text[0],
          "inputs in order");
    srv_embed_request_free(&r);
    b = "{\"content\": [5, 6]}";
    CHECK(srv_embed_parse(b, strlen(b), 1, 2, &r, &e) == 0, "%s", e.message);
    CHECK(!r.oai && r.n_inputs == 1 && r.inputs[0].n_ids == 2 && r.normalize == 2,
          "content: llama-server's shape, one input of ids, the server's default norm");
    srv_embed_request_free(&r);
    const char *bad[] = {"{}",
                         "[]",
                         "nope",
                         "{\"input\": 3}",
                         "{\"input\": []}",
                         "{\"input\": [[]]}",
                         "{\"input\": [1, \"a\"]}",
                         "{\"input\": [\"a\", 1]}",
                         "{\"input\": [-1]}",
                         "{\"input\": [2.5]}",
                         "{\"input\": [1e12]}",
                         "{\"input\": {\"a\": 1}}",
                         "{\"input\": [[1, \"a\"]]}",
                         "{\"input\": \"a\", \"encoding_format\": \"int8\"}",
                         "{\"input\": \"a\", \"encoding_format\": 1}",
                         "{\"input\": \"a\", \"embd_normalize\": \"2\"}",
                         "{\"input\": \"a\", \"embd_normalize\": 1.5}",
                         "{\"input\": \"a\", \"embd_normalize\": -2}",
                         "{\"input\": \"\xff\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        CHECK(srv_embed_parse(bad[i], strlen(bad[i]), 1, 2, &r, &e) == -1 && e.status == 400 &&
                  e.message[0],
              "refused with a message: %s", bad[i]);
        CHECK(r.inputs == NULL && r.n_inputs == 0, "nothing left allocated: %s", bad[i]);
    }
    /* every prefix of a valid body (truncated bodies) is refused or parsed, never a crash */
    b = "{\"input\": [\"ab\", [1, 2]], \"encoding_format\": \"float\", \"embd_normalize\": 0}";
    for (size_t n = 0; n <= strlen(b); n++)
        if (!srv_embed_parse(b, n, 1, 2, &r, &e)) srv_embed_request_free(&r);

    CHECK(srv_pooling_parse("mean") == SRV_POOL_MEAN &&
              srv_pooling_parse("last") == SRV_POOL_LAST &&
              srv_pooling_parse("cls") == SRV_POOL_CLS &&
              srv_pooling_parse("none") == SRV_POOL_NONE && srv_pooling_parse("rank") == -1 &&
              srv_pooling_parse(NULL) == -1,
          "pooling names");
    float h[6] = {1, 2, 3, 5, -1, 4}, v[2]; /* 3 rows of 2 */
    srv_embed_pool(SRV_POOL_MEAN, h, 3, 2, v);
    CHECK(v[0] == 1.0f && v[1] == 11.0f / 3, "mean %g %g", v[0], v[1]);
    srv_embed_pool(SRV_POOL_CLS, h, 3, 2, v);
    CHECK(v[0] == 1 && v[1] == 2, "cls");
    srv_embed_pool(SRV_POOL_LAST, h, 3, 2, v);
    CHECK(v[0] == -1 && v[1] == 4, "last");
    float w[2] = {3, -4};
    srv_embed_normalize(w, 2, 2);
    CHECK_NEAR(w[0], 0.6, 1e-7);
    CHECK_NEAR(w[1], -0.8, 1e-7);
    w[0] = 3, w[1] = -4;
    srv_embed_normalize(w, 2, 1);
    CHECK_NEAR(w[0], 3.0 / 7, 1e-7);
    w[0] = 3, w[1] = -4;
    srv_embed_normalize(w, 2, 0);
    CHECK_NEAR(w[1], -32760, 1e-3);
    w[0] = 3, w[1] = -4;
    srv_embed_normalize(w, 2, 3);
    CHECK_NEAR(w[0], 3 / cbrt(91.0), 1e-6);
    w[0] = 3, w[1] = -4;
    srv_embed_normalize(w, 2, -1);
    CHECK(w[0] == 3 && w[1] == -4, "-1 leaves it");
    w[0] = 0, w[1] = 0;
    srv_embed_normalize(w, 2, 2);
    CHECK(w[0] == 0 && w[1] == 0, "a zero vector stays zero");

    /* answers: 1.0f and -2.0f are 0000803f 000000c0, "AACAPwAAAMA=" in base64 */
    float one[2] = {1.0f, -2.0f}, two[4] = {0.5f, 0.25f, 1, 2};
    float *vecs[2] = {one, two};
    int rows[2] = {1, 2};
    b = "{\"input\": [\"a\", \"b\"], \"encoding_format\": \"base64\"}";
    CHECK(srv_embed_parse(b, strlen(b), 1, 2, &r, &e) == 0, "%s", e.message);
    char *out = srv_embed_response(&r, SRV_POOL_MEAN, vecs, rows, 2, "mdl");
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    const cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    CHECK(d0 && !strcmp(cJSON_GetObjectItem(d0, "embedding")->valuestring, "AACAPwAAAMA="),
          "base64: %s", out ? out : "");
    CHECK(j && !strcmp(cJSON_GetObjectItem(j, "model")->valuestring, "mdl") &&
              cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens")->valueint == 3,
          "model and usage: %s", out ? out : "");
    cJSON_Delete(j);
    free(out);
    srv_embed_request_free(&r);
    b = "{\"content\": [\"a\", \"b\"]}";
    CHECK(srv_embed_parse(b, strlen(b), 0, 2, &r, &e) == 0, "%s", e.message);
    out = srv_embed_response(&r, SRV_POOL_NONE, vecs, rows, 2, "mdl");
    CHECK(out && !strcmp(out, "[{\"index\":0,\"embedding\":[[1,-2]]},{\"index\":1,\"embedding\":"
                              "[[0.5,0.25],[1,2]]}]"),
          "per-token rows: %s", out ? out : "");
    free(out);
    srv_embed_request_free(&r);

    /* the scheduler's hidden rows are a session's own, beside generation */
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    if (!load_stories(&m, &tok)) return;
    int32_t *ids;
    size_t n;
    CHECK_OK(tlm_tokenizer_encode(tok, "Once upon a time", 16, TLM_ENCODE_ADD_BOS, &ids, &n));
    int dm = tlm_model_config(m)->d_model;
    float *want = malloc(n * (size_t)dm * sizeof *want), *got = calloc(n * (size_t)dm, sizeof *got);
    tlm_session *ss = NULL;
    CHECK_OK(tlm_session_new(m, NULL, &ss));
    CHECK_OK(tlm_session_prefill_hidden(ss, 0, ids, (int)n, want));
    srv_sched *s = NULL;
    srv_sched_opts so = {.parallel = 2, .ctx = 64};
    CHECK_OK(srv_sched_new(m, tok, &so, &s));
    srv_embed_op op = {.ids = ids, .n = (int)n, .hidden = got};
    CHECK(s && srv_sched_embed(s, &op) == TLM_ERR_ARG, "no embeddings session: refused");
    srv_sched_free(s);
    so.embeddings = 1;
    s = NULL;
    CHECK_OK(srv_sched_new(m, tok, &so, &s));
    srv_job *job = greedy_job(ids, (int)n, 20);
    CHECK_OK(srv_sched_submit(s, &job, 1));
    CHECK_OK(srv_sched_embed(s, &op));
    CHECK(op.status == 0 && !memcmp(got, want, n * (size_t)dm * sizeof *got),
          "the scheduler's rows are the session's");
    CHECK_OK(srv_sched_embed(s, &op));
    CHECK(!memcmp(got, want, n * (size_t)dm * sizeof *got), "a second time: the same rows");
    int32_t far[2] = {1, 1 << 20};
    srv_embed_op bad_op = {.ids = far, .n = 2, .hidden = got};
    CHECK_OK(srv_sched_embed(s, &bad_op));
    CHECK(bad_op.status == 400 && strstr(bad_op.error, "vocabulary"), "an id outside: %s",
          bad_op.error);
    wait_done(s, &job, 1);
    CHECK(job->completion_tokens == 20, "generation beside embeddings");
    srv_sched_release(s, job);
    srv_job_free(job);
    srv_sched_close(s);
    CHECK(srv_sched_embed(s, &op) == TLM_ERR_INTERRUPTED, "refused once draining");
    srv_sched_free(s);
    tlm_session_free(ss);
    free(want);
    free(got);
    free(ids);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
}

/* Llama 3.1's tool format: Meta's template's text (the tools before the first user message,
 * indented as its tojson, a call as {"name", "parameters"}, results in ipython turns), the answer's
 * call with or without <|python_tag|> (broken ones stay text), and the grammar of a named call. */
static void test_tools_llama3(void) {
    CHECK(srv_tools_format(TLM_CHAT_LLAMA3) == SRV_TOOLFMT_LLAMA3 &&
              srv_tools_format(TLM_CHAT_CHATML) == SRV_TOOLFMT_HERMES &&
              srv_tools_format(TLM_CHAT_GEMMA) == -1,
          "formats of the families");
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
        "\"content\":\"W?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
        "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
        "\"{\\\"city\\\":\\\"P\\\",\\\"n\\\":[1,2]}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
        "\"c1\",\"content\":\"21\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"w\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
        "\"string\"}},\"required\":[\"city\"]}}}],\"tool_choice\":{\"type\":\"function\","
        "\"function\":{\"name\":\"w\"}}}";
    srv_request r;
    srv_error e;
    CHECK(srv_request_parse(body, strlen(body), SRV_CHAT, &r, &e) == 0, "%s", e.message);
    CHECK(srv_tools_set_format(&r, SRV_TOOLFMT_LLAMA3, &e) == 0 && r.grammar, "%s", e.message);
    srv_message *m = NULL;
    int n = 0;
    CHECK(srv_tools_messages(&r, &m, &n, &e) == 0 && n == 4, "llama3 messages: %d", n);
    char *text = NULL;
    if (n == 4) CHECK_OK(srv_template_apply(TLM_CHAT_LLAMA3, m, n, &text));
    const char *want =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers the "
        "given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": "
        "\"function\",\n    \"function\": {\n        \"name\": \"w\",\n        \"parameters\": "
        "{\n            \"type\": \"object\",\n            \"properties\": {\n                "
        "\"city\": {\n                    \"type\": \"string\"\n                }\n            "
        "},\n            \"required\": [\n                \"city\"\n            ]\n        }\n"
        "    }\n}\n\nW?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
        "\"w\", \"parameters\": {\"city\": \"P\", \"n\": [1, 2]}}<|eot_id|><|start_header_id|>"
        "ipython<|end_header_id|>\n\n21<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\n\n";
    CHECK(text && !strcmp(text, want), "Meta's text:\n%s", text ? text : "(null)");
    free(text);
    srv_messages_free(m, n);
    /* the named call's grammar: {"name": "w", "parameters": {...}} and nothing else */
    tlm_tokenizer *tok = NULL;
    tlm_grammar_vocab *v = NULL;
    tlm_grammar_state *st = NULL;
    char alphabet[96];
    int k = 0;
    for (int ch = 32; ch < 127; ch++) alphabet[k++] = (char)ch;
    alphabet[k++] = '\n';
    CHECK_OK(tlm_tokenizer_new_char(alphabet, (size_t)k, &tok));
    CHECK_OK(tlm_grammar_vocab_new(tok, tlm_tokenizer_vocab_size(tok), &v));
    CHECK_OK(tlm_grammar_state_new(r.grammar, v, &st));
    const char *good = "{\"name\": \"w\", \"parameters\": {\"city\": \"Oslo\"}}";
    CHECK(!tlm_grammar_state_accept_bytes(st, good, strlen(good)) && tlm_grammar_state_complete(st),
          "the grammar takes a Llama 3 call of w");
    tlm_grammar_state_reset(st);
    const char *bad = "<tool_call>";
    CHECK(tlm_grammar_state_accept_bytes(st, bad, strlen(bad)) != TLM_OK,
          "the grammar refuses the Hermes wrapper");
    tlm_grammar_state_free(st);
    tlm_grammar_vocab_free(v);
    tlm_tokenizer_free(tok);
    srv_request_free(&r);
    /* no user message to carry the tools */
    body = "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"}],\"tools\":[{\"type\":"
           "\"function\",\"function\":{\"name\":\"w\"}}]}";
    CHECK(srv_request_parse(body, strlen(body), SRV_CHAT, &r, &e) == 0, "%s", e.message);
    CHECK(srv_tools_set_format(&r, SRV_TOOLFMT_LLAMA3, &e) == 0, "%s", e.message);
    CHECK(srv_tools_messages(&r, &m, &n, &e) == -1 && e.status == 400 && strstr(e.message, "user"),
          "tools without a user message: %s", e.message);
    srv_request_free(&r);

    srv_tool_parse p;
    const char *calls[] = {"<|python_tag|>{\"name\": \"w\", \"parameters\": {\"city\": \"P\"}}",
                           " {\"name\": \"w\", \"parameters\": {\"city\": \"P\"}}\n",
                           "{\"name\": \"w\", \"arguments\": {\"city\": \"P\"}}"};
    for (int i = 0; i < 3; i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_LLAMA3, calls[i], strlen(calls[i]), 3, &p) == 0 &&
                  p.n_calls == 1 && !p.content && p.calls &&
                  strstr(p.calls, "\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\""),
              "call %d: %s", i, p.calls ? p.calls : "(null)");
        srv_tool_parse_free(&p);
    }
    const char *two =
        "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}";
    CHECK(srv_tools_parse_as(SRV_TOOLFMT_LLAMA3, two, strlen(two), 3, &p) == 0 && p.n_calls == 2,
          "two calls: %d", p.n_calls);
    srv_tool_parse_free(&p);
    const char *broken[] = {"{\"name\": \"w\", \"param",
                            "{\"name\": \"w\", \"parameters\": {}} and more",
                            "{\"parameters\": {}}",
                            "{\"name\": 3, \"parameters\": {}}",
                            "{\"name\": \"w\", \"parameters\": \"x\"}",
                            "The answer is 21.",
                            "<|python_tag|>",
                            ""};
    for (int i = 0; i < 8; i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_LLAMA3, broken[i], strlen(broken[i]), 1, &p) == 0 &&
                  p.n_calls == 0 && !p.calls,
              "broken %d parsed as a call", i);
        CHECK(i == 7 ? !p.content : p.content && !strcmp(p.content, broken[i]),
              "broken %d kept as text: %s", i, p.content ? p.content : "(null)");
        srv_tool_parse_free(&p);
    }
    /* every prefix of a call (a cut-off answer) is text or a call, never a crash */
    for (size_t i = 0; i <= strlen(calls[0]); i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_LLAMA3, calls[0], i, 1, &p) == 0, "prefix %zu", i);
        srv_tool_parse_free(&p);
    }
}

/* Mistral Nemo's tool format: the tekken template's text (rendered by its Jinja source: tools
 * before the last user message, calls with their ids, results unquoted with their call ids), the
 * 400s of ids the template refuses, the answer's calls with and without the [TOOL_CALLS] marker
 * (which decoding drops as a control token), broken ones staying text, and the call array's
 * grammar. */
static void test_tools_mistral(void) {
    CHECK(srv_tools_format(TLM_CHAT_MISTRAL_NEMO) == SRV_TOOLFMT_MISTRAL &&
              srv_tools_format(TLM_CHAT_MISTRAL) == -1,
          "Mistral's formats");
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
        "\"content\":\"W?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
        "\"abcDEF123\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
        "\"{\\\"city\\\":\\\"P\\\",\\\"n\\\":[1,2]}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
        "\"abcDEF123\",\"content\":\"21\"},{\"role\":\"assistant\",\"content\":\"It is 21.\"},"
        "{\"role\":\"user\",\"content\":\"And O?\"}],\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"w\",\"description\":\"The weather.\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
        "\"tool_choice\":\"required\",\"parallel_tool_calls\":false}";
    srv_request r;
    srv_error e;
    CHECK(srv_request_parse(body, strlen(body), SRV_CHAT, &r, &e) == 0, "%s", e.message);
    CHECK(r.n_messages == 6 && r.messages[3].tool_call_id &&
              !strcmp(r.messages[3].tool_call_id, "abcDEF123"),
          "the tool message keeps its tool_call_id");
    CHECK(srv_tools_set_format(&r, SRV_TOOLFMT_MISTRAL, &e) == 0 && r.grammar, "%s", e.message);
    char *text = NULL;
    CHECK(srv_tools_prompt(&r, &text, &e) == 0, "%s", e.message);
    /* the Jinja template's output for this conversation (jinja2, tojson as json.dumps) */
    const char *want =
        "<s>[INST]W?[/INST][TOOL_CALLS][{\"name\": \"w\", \"arguments\": {\"city\": \"P\", \"n\": "
        "[1, 2]}, \"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS]{\"content\": 21, \"call_id\": "
        "\"abcDEF123\"}[/TOOL_RESULTS]It is 21.</s>[AVAILABLE_TOOLS][{\"type\": \"function\", "
        "\"function\": {\"name\": \"w\", \"description\": \"The weather.\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
        "[\"city\"]}}}][/AVAILABLE_TOOLS][INST]Be brief.\n\nAnd O?[/INST]";
    CHECK(text && !strcmp(text, want), "Mistral's text:\n%s", text ? text : "(null)");
    free(text);
    /* the required call's grammar: an array of one call of w, without an id (the parser's) */
    tlm_tokenizer *tok = NULL;
    tlm_grammar_vocab *v = NULL;
    tlm_grammar_state *st = NULL;
    char alphabet[96];
    int k = 0;
    for (int ch = 32; ch < 127; ch++) alphabet[k++] = (char)ch;
    alphabet[k++] = '\n';
    CHECK_OK(tlm_tokenizer_new_char(alphabet, (size_t)k, &tok));
    CHECK_OK(tlm_grammar_vocab_new(tok, tlm_tokenizer_vocab_size(tok), &v));
    CHECK_OK(tlm_grammar_state_new(r.grammar, v, &st));
    const char *good = "[{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}]";
    CHECK(!tlm_grammar_state_accept_bytes(st, good, strlen(good)) && tlm_grammar_state_complete(st),
          "the grammar takes a Mistral call of w");
    const char *bad[] = {"<tool_call>", "{\"name\": \"w\"",
                         "[{\"name\": \"w\", \"arguments\": {\"city\": \"O\"}}, {",
                         "[{\"name\": \"w\", \"arguments\": {\"city\": \"O\"}, \"id\""};
    for (int i = 0; i < 4; i++) {
        tlm_grammar_state_reset(st);
        CHECK(tlm_grammar_state_accept_bytes(st, bad[i], strlen(bad[i])) != TLM_OK,
              "the grammar refuses %s", bad[i]);
    }
    tlm_grammar_state_free(st);
    srv_request_free(&r);
    /* parallel calls: several in the array */
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"W?\"}],\"tools\":[{\"type\":"
           "\"function\",\"function\":{\"name\":\"w\"}}],\"tool_choice\":\"required\"}";
    CHECK(srv_request_parse(body, strlen(body), SRV_CHAT, &r, &e) == 0, "%s", e.message);
    CHECK(srv_tools_set_format(&r, SRV_TOOLFMT_MISTRAL, &e) == 0 && r.grammar, "%s", e.message);
    CHECK_OK(tlm_grammar_state_new(r.grammar, v, &st));
    const char *two =
        "[{\"name\": \"w\", \"arguments\": {}}, {\"name\": \"w\", \"arguments\": {}}]";
    CHECK(!tlm_grammar_state_accept_bytes(st, two, strlen(two)) && tlm_grammar_state_complete(st),
          "parallel calls in one array");
    tlm_grammar_state_free(st);
    tlm_grammar_vocab_free(v);
    tlm_tokenizer_free(tok);
    CHECK(srv_tools_prompt(&r, &text, &e) == 0 && text &&
              !strcmp(text, "<s>[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": "
                            "{\"name\": \"w\"}}][/AVAILABLE_TOOLS][INST]W?[/INST]"),
          "one user message: %s", text ? text : e.message);
    free(text);
    srv_request_free(&r);
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
           "\"content\":\"Hello!\",\"tool_calls\":[]},{\"role\":\"user\",\"content\":\"W?\"}]}";
    CHECK(srv_request_parse(body, strlen(body), SRV_CHAT, &r, &e) == 0, "%s", e.message);
    CHECK(srv_tools_prompt(&r, &text, &e) == 0 && text &&
              !strcmp(text, "<s>[INST]Hi[/INST]Hello!</s>[INST]W?[/INST]"),
          "an empty tool_calls is a plain answer: %s", text ? text : e.message);
    free(text);
    srv_request_free(&r);

    /* what the template refuses is a 400 naming it */
    const char *refused[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"W?\"},{\"role\":\"assistant\","
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"w\","
        "\"arguments\":\"{}\"}}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"W?\"},{\"role\":\"tool\","
        "\"tool_call_id\":\"abcDEF12-\",\"content\":\"1\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"W?\"},{\"role\":\"tool\","
        "\"content\":\"1\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"W?\"},{\"role\":\"system\","
        "\"content\":\"s\"}]}"};
    const char *why[] = {"'id'", "tool_call_id", "tool_call_id", "system"};
    for (int i = 0; i < 4; i++) {
        CHECK(srv_request_parse(refused[i], strlen(refused[i]), SRV_CHAT, &r, &e) == 0, "%s",
              e.message);
        text = NULL;
        CHECK(srv_tools_prompt(&r, &text, &e) == -1 && !text && e.status == 400 &&
                  strstr(e.message, why[i]),
              "refused %d: %s", i, e.message);
        srv_request_free(&r);
    }
    body = "{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":7,\"content\":\"1\"}]}";
    CHECK(parse_fails(body, 1, "messages", 400), "a tool_call_id that is not a string");

    srv_tool_parse p;
    const char *calls[] = {
        "[TOOL_CALLS][{\"name\": \"w\", \"arguments\": {\"city\": \"P\"}, \"id\": \"abcDEF123\"}]",
        " [{\"name\": \"w\", \"arguments\": {\"city\": \"P\"}}]\n",
        ("Let me look. [TOOL_CALLS][{\"name\": \"w\", \"arguments\": {\"city\": \"P\"}, "
         "\"id\": 7}]")};
    for (int i = 0; i < 3; i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_MISTRAL, calls[i], strlen(calls[i]), 3, &p) == 0 &&
                  p.n_calls == 1 && p.calls &&
                  strstr(p.calls, "\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\""),
              "call %d: %s", i, p.calls ? p.calls : "(null)");
        CHECK(i == 2 ? p.content && !strcmp(p.content, "Let me look.") : !p.content,
              "call %d's content: %s", i, p.content ? p.content : "(null)");
        cJSON *j = cJSON_Parse(p.calls ? p.calls : "");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(j, 0), "id");
        CHECK(cJSON_IsString(id) && strlen(id->valuestring) == 9 &&
                  strspn(id->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789") == 9,
              "call %d's id is 9 letters and digits", i);
        CHECK(i || !strcmp(id->valuestring, "abcDEF123"), "the model's id is kept");
        cJSON_Delete(j);
        srv_tool_parse_free(&p);
    }
    const char *pair = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", "
                       "\"arguments\": {}}]";
    CHECK(srv_tools_parse_as(SRV_TOOLFMT_MISTRAL, pair, strlen(pair), 5, &p) == 0 && p.n_calls == 2,
          "two calls: %d", p.n_calls);
    cJSON *j = cJSON_Parse(p.calls ? p.calls : "");
    const cJSON *id0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(j, 0), "id");
    const cJSON *id1 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(j, 1), "id");
    CHECK(cJSON_IsString(id0) && cJSON_IsString(id1) && strcmp(id0->valuestring, id1->valuestring),
          "the calls' ids differ");
    cJSON_Delete(j);
    srv_tool_parse_free(&p);
    /* the whole calls before a cut or a malformed element are calls, what follows is text */
    const char *partial[][2] = {
        {"[TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}] and more", "and more"},
        {"[{\"name\": \"w\", \"arguments\": {}}, 7]", "7]"},
        {"Hm. [TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}, {\"name\": \"b\", \"argu",
         "Hm. {\"name\": \"b\", \"argu"}};
    for (int i = 0; i < 3; i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_MISTRAL, partial[i][0], strlen(partial[i][0]), 1,
                                 &p) == 0 &&
                  p.n_calls == 1 && p.calls && strstr(p.calls, "\"name\":\"w\"") && p.content &&
                  !strcmp(p.content, partial[i][1]),
              "partial %d: %d calls, content %s", i, p.n_calls, p.content ? p.content : "(null)");
        srv_tool_parse_free(&p);
    }
    const char *broken[] = {"[TOOL_CALLS][{\"name\": \"w\", \"argu",
                            "[TOOL_CALLS][]",
                            "[TOOL_CALLS]",
                            "[1, 2]",
                            "[{\"arguments\": {}}]",
                            "[{\"name\": 3, \"arguments\": {}}]",
                            "[{\"name\": \"w\", \"arguments\": \"x\"}]",
                            "[Note] it rains.",
                            "The answer is 21.",
                            ""};
    for (int i = 0; i < 10; i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_MISTRAL, broken[i], strlen(broken[i]), 1, &p) == 0 &&
                  p.n_calls == 0 && !p.calls,
              "broken %d parsed as a call", i);
        CHECK(i == 9 ? !p.content : p.content && !strcmp(p.content, broken[i]),
              "broken %d kept as text: %s", i, p.content ? p.content : "(null)");
        srv_tool_parse_free(&p);
    }
    /* every prefix of an answer (a cut-off one) is text and the calls it holds whole, never a
     * crash: the count grows from none to both */
    int last = 0;
    for (size_t i = 0; i <= strlen(pair); i++) {
        CHECK(srv_tools_parse_as(SRV_TOOLFMT_MISTRAL, pair, i, 1, &p) == 0 && p.n_calls >= last,
              "prefix %zu: %d calls", i, p.n_calls);
        last = p.n_calls;
        srv_tool_parse_free(&p);
    }
    CHECK(last == 2, "the whole pair: %d calls", last);
}

int main(void) {
    test_embeddings();
    test_tools_mistral();
    test_tools_llama3();
    test_tools();
    test_responses();
    test_templates();
    test_requests();
    test_stop_scan();
    test_sampler_extras();
    test_scheduler();
    test_prompt_cache();
    test_ring();
    test_cache_types();
    return t_finish("test_serve");
}
