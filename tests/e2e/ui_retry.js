// Argo's UI in headless Chromium: open a failed workflow (or an archived one, by its UID),
// press RETRY, then the panel's Retry, and wait for the UI to show the workflow it got
// back, as a user does. Run by tests/e2e/clients.rs (scenarios ui-*) with Node.js:
//
//   node ui_retry.js BASE_URL TOKEN NAMESPACE NAME [UID]
//
// NODE_PATH holds playwright-core (tools/clients/browser.sh); it drives Debian's chromium.
const {chromium} = require('playwright-core');

async function main() {
    const [base, token, namespace, name, uid] = process.argv.slice(2);
    const browser = await chromium.launch({
        executablePath: '/usr/bin/chromium',
        // As root, with no sandbox; no background traffic, which this machine's network refuses.
        args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']
    });
    try {
        const context = await browser.newContext();
        // What Argo's login page stores after "Login" with a client token.
        await context.addCookies([{name: 'authorization', value: `Bearer ${token}`, url: base}]);
        const page = await context.newPage();
        page.setDefaultTimeout(60000);
        const path = uid ? `workflows/${namespace}/${name}?uid=${uid}` : `workflows/${namespace}/${name}`;
        await page.goto(new URL(path, base).toString());
        // Once the toolbar's RETRY is pressed, the panel that opens has a second Retry
        // button, its submit.
        const retry = page.locator('button', {hasText: /retry/i});
        await retry.first().waitFor();
        // A new browser is greeted with modals (first-time user, then new version) over
        // the page: closed as a user closes them.
        for (let i = 0; i < 5; i++) {
            const closed = await page.locator('.modal .modal-close').first().click({timeout: 3000}).then(() => true, () => false);
            if (!closed) break;
        }
        await retry.first().click().catch(async e => {
            // What the page offers instead, for the error.
            const buttons = await page.locator('button').evaluateAll(bs => bs.map(b => b.outerHTML)).catch(() => []);
            const text = (await page.locator('body').innerText().catch(() => '')).slice(0, 2000);
            await page.screenshot({path: process.env.SCREENSHOT || '/dev/null'}).catch(() => {});
            throw new Error(`${e.message}\nbuttons: ${JSON.stringify(buttons)}\npage text:\n${text}`);
        });
        const call = page.waitForResponse(r => r.request().method() === 'PUT' && r.url().endsWith('/retry'), {timeout: 600000});
        await page.waitForFunction(() => [...document.querySelectorAll('button')]
            .filter(b => b.innerText.trim().toLowerCase() === 'retry').length > 1);
        await retry.last().click();
        const answer = await call;
        const body = await answer.json();
        if (answer.status() !== 200) {
            throw new Error(`the retry call answered ${answer.status()}: ${JSON.stringify(body)}`);
        }
        // The panel closes and the page shows the retried workflow.
        await page.waitForURL(u => u.pathname.endsWith(`/workflows/${body.metadata.namespace}/${body.metadata.name}`));
        await page.screenshot({path: process.env.SCREENSHOT || '/dev/null'}).catch(() => {});
        console.log(`retried ${body.metadata.namespace} ${body.metadata.name} via ${answer.url()}`);
    } finally {
        await browser.close();
    }
}

main().catch(e => {
    console.error(e.stack || String(e));
    process.exit(1);
});
